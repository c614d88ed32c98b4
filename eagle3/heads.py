"""Versioned draft heads on disk, one directory per target:

    models/eagle3-<target>/              the shipped head: version 0 (left as it is)
    models/eagle3-<target>/versions/<n>/ adapted heads, n = 1, 2, ... (config.json, model.safetensors, meta.json)
    models/eagle3-<target>/current       the version decoders load (a number; replaced atomically; absent = 0)

meta.json records what the gate measured when the version was installed (its τ and its parent's τ on the same
held-out items) and its parent, which is what --rollback returns to. EAGLE3_MODELS_DIR moves the whole tree (tests
use a temporary one, so they never touch the shipped head). Plain files and no model code: the worker checks the
pointer before every batch."""
import json
import os
from pathlib import Path

POINTER = "current"


def models_dir() -> Path:
    return Path(os.environ.get("EAGLE3_MODELS_DIR") or Path(__file__).resolve().parent.parent / "models")


def head_root(target_name: str) -> Path:
    return models_dir() / f"eagle3-{target_name}"


def version_dir(root: Path, version: int) -> Path:
    return root if version == 0 else root / "versions" / str(version)


def has_weights(path: Path) -> bool:
    return (path / "config.json").exists()


def current_version(root: Path) -> int:
    try:
        return int((root / POINTER).read_text().strip())
    except FileNotFoundError:
        return 0


def pointer_stamp(root: Path):
    """What changes whenever `current` is replaced (a new inode each time): one stat, cheap enough per batch."""
    try:
        st = os.stat(root / POINTER)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def set_current(root: Path, version: int) -> None:
    """Write the pointer beside itself and rename it over the old one: a reader sees the old or the new number,
    never a half-written file."""
    _require_version(root, version)
    tmp = root / f".{POINTER}.{os.getpid()}.tmp"
    tmp.write_text(f"{version}\n")
    os.replace(tmp, root / POINTER)


def read_meta(root: Path, version: int) -> dict:
    path = version_dir(root, version) / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def list_versions(root: Path) -> list[int]:
    found = [int(p.name) for p in (root / "versions").glob("*") if p.name.isdigit() and has_weights(p)]
    return [0] + sorted(found)


def new_version_dir(root: Path) -> tuple[int, Path]:
    """Claim the next version number; mkdir is the lock, so two adapters at once never share a number."""
    (root / "versions").mkdir(parents=True, exist_ok=True)
    n = max(list_versions(root)) + 1
    while True:
        path = version_dir(root, n)
        try:
            path.mkdir()
            return n, path
        except FileExistsError:
            n += 1


def rollback(root: Path) -> tuple[int, int]:
    """Point `current` at the current version's parent. Returns (from, to)."""
    version = current_version(root)
    if version == 0:
        raise ValueError("the current head is version 0 (the shipped head): nothing to roll back to")
    parent = int(read_meta(root, version).get("parent", 0))
    set_current(root, parent)
    return version, parent


def _require_version(root: Path, version: int) -> None:
    if version != 0 and not has_weights(version_dir(root, version)):
        raise ValueError(f"no head version {version} under {root}")
