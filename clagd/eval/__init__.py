"""Evaluation: `clagd eval locomo`, evidence recall of clagd against flat BM25 and recency on
LoCoMo-format conversations. Imports the engine and everything below it."""
