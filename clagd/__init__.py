"""clagd: a git-versioned memory daemon for small-language-model agents (CLAG)."""

__version__ = "0.1.0"
