"""Making a store and keeping it private: the template, `init_store`, and the check that
other local users cannot read it (`PrivacyStatus`, the `privacy` section of `status`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from clagd.errors import StoreError
from clagd.store.files import ARCHIVE, CLUSTERS, INBOX, UNSORTED, Paths


def template_dir() -> Path:
    """store_template/: packaged as `clagd.store_template` in a wheel; beside the package in
    a source checkout (where `clagd` is imported from the work tree)."""
    try:
        return Path(str(resources.files("clagd.store_template")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "store_template"


def is_store(path: Path) -> bool:
    return (Path(path) / "clagd.yaml").is_file() and (Path(path) / ".git").exists()


def enclosing_store(path: Path) -> Path | None:
    """The store `path` lies inside (one of its folders, not the store itself), or None."""
    for parent in Path(path).expanduser().resolve().parents:
        if is_store(parent):
            return parent
    return None


def copy_template(dest: Path) -> list[Path]:
    """Copy store_template/ into dest without overwriting anything already there; return the
    files it created."""
    src = template_dir()
    created: list[Path] = []
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        if rel.parts[0] == "__pycache__" or item.name in ("__init__.py",):
            continue
        target = dest / rel
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, target)
            created.append(target)
    return created


def init_store(root: Path, force: bool = False) -> tuple[Path, bool]:
    """Create a store from store_template/, `git init`, first commit. Returns (path, created).

    A folder that holds something but no store is refused (StoreError) unless `force`: a
    mistyped path must not turn someone's folder into a store. Even then the files already
    there are left alone and out of the init commit, which holds only what init created.
    The store is private: a new folder is 0700 and every file is created under umask 077."""
    root = Path(root).expanduser().resolve()
    if is_store(root):
        Paths(root).ensure_dirs()
        return root, False
    outer = enclosing_store(root)
    if outer is not None:  # a store in clusters/ would be files of the outer store
        raise StoreError(
            f"{root} is inside the clagd store {outer}: use that store (--store {outer}), "
            "or choose a folder outside it",
            "inside_store",
        )
    if root.is_dir() and any(root.iterdir()) and not force:
        raise StoreError(
            f"{root} is not empty and not a clagd store (no clagd.yaml and .git): choose an "
            f"empty or new folder, or make a store here with `clagd init --force {root}` "
            "(files already there are kept and not committed)",
            "not_empty",
        )
    old_umask = os.umask(PRIVATE_UMASK)  # memories are private: nothing readable by others
    try:
        return _create_store(root), True
    finally:
        os.umask(old_umask)


def _create_store(root: Path) -> Path:
    from clagd.store.gitrepo import GitStore

    existed = root.is_dir()
    root.mkdir(parents=True, exist_ok=True)
    if not existed:
        os.chmod(root, 0o700)
    created = copy_template(root)
    paths = Paths(root)
    paths.ensure_dirs()
    for d in (paths.clusters, paths.archive, paths.unsorted):
        keep = d / ".gitkeep"
        if not any(d.iterdir()):
            keep.touch()
            created.append(keep)
    git = GitStore(root)
    git.init()
    if git.head() is None:
        mine = [str(p.relative_to(root)) for p in created]
        git.commit(mine, "init: new clagd store", "", {"kind": "init"})
    return root


PRIVATE_UMASK = 0o077
# what must not be open to other users: the memories, their history, rejected inbox files
PRIVATE_PATHS = (
    "",
    ".git",
    ".git/objects",
    CLUSTERS,
    ARCHIVE,
    UNSORTED,
    INBOX,
    f"{INBOX}/rejected",
)


@dataclass(frozen=True)
class PrivacyStatus:
    """The `privacy` section of `status`: whether the store is closed to other users."""

    private: bool
    warnings: tuple[str, ...]

    @classmethod
    def of(cls, root: Path) -> PrivacyStatus:
        warnings = privacy_warnings(root)
        return cls(not warnings, tuple(warnings))


def privacy_warnings(root: Path) -> list[str]:
    """The store's folders that other local users can enter or read (empty: private)."""
    out = []
    for rel in PRIVATE_PATHS:
        p = Path(root) / rel
        try:
            mode = p.stat().st_mode
        except OSError:
            continue
        if mode & 0o005:
            out.append(
                f"{rel or 'the store'} ({p}) is readable by other users: chmod -R go-rwx {root}"
            )
    return out
