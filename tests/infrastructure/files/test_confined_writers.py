"""Only the confined file layer writes team and project files; a grep keeps it so.

Every other module that could open a file for writing, rename, delete or create a directory
is listed here with the reason it is not a team or project file.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

WRITE_CALLS = re.compile(
    r"os\.(open|replace|rename|renames|link|symlink|unlink|remove|rmdir|makedirs|mkdir|"
    r"truncate|ftruncate|pwrite|write)\(|"
    r"\.(write_text|write_bytes|unlink|mkdir|rmdir|rename|touch|symlink_to|"
    r"hardlink_to)\(|"
    r"shutil\.|tempfile\.(mkstemp|NamedTemporaryFile|mkdtemp)|"
    r"""open\([^)]*["'](w|a|x|r\+|wb|ab|xb|rb\+|w\+|a\+)["']"""
)

# module -> (calls it may make, why the file it touches is not a team or project file)
ALLOWED: dict[str, tuple[set[str], str]] = {
    "infrastructure/files/confined.py": (set(), "the confined layer itself"),
    "infrastructure/files/links.py": (
        {
            "os.symlink(",
            "os.rename(",
            "os.unlink(",
            "os.mkdir(",
            "os.rmdir(",
            "os.open(",
            "os.write(",
            "os.link(",
        },
        "the confined layer's link, new trees, directory rename and removal (by descriptors)",
    ),
    "infrastructure/releases/materialize.py": (
        {".mkdir("},
        "a worker's own release folder (the root itself; files go through the confined layer)",
    ),
    "infrastructure/files/atomic.py": (
        {"os.open(", ".mkdir("},
        "lock files and the parent folder of a workspace file (the store, the audit head)",
    ),
    "infrastructure/store/sqlite.py": ({".mkdir("}, "the folder of the database file"),
    "infrastructure/changes/audit/head.py": ({"os.pwrite("}, "the audit head file, in place"),
    "agents/faces/workspace.py": ({".mkdir("}, "the workspace folder"),
    "agents/faces/cli/store.py": (
        {".mkdir(", "shutil."},
        "the workspace folder `store init` makes, removed again when its first open fails",
    ),
    "agents/faces/cli/app.py": ({"os.open("}, "/dev/null, for stdout after a broken pipe"),
    "agents/faces/session/lock.py": (
        {"os.open(", "os.ftruncate(", "os.write("},
        "the session's lock file in the workspace (its pid), not a team or project file",
    ),
    "agents/faces/release_serving.py": (
        {"os.open("},
        "the lock file of a face's worker folder in the workspace, not a team or project file",
    ),
    "agents/faces/mcp/stdin.py": ({"os.open("}, "/dev/null, read-only, for fd 0 while serving"),
    "infrastructure/llm/claude/runtime.py": (
        {"shutil.", "tempfile.mkdtemp"},
        "the CLI's temporary HOME",
    ),
    "infrastructure/code_update/sandbox.py": (
        {
            ".unlink(",
            ".write_text(",
            'open(os.environ["AGENTMEND_IMPORT_REPORT"], "w"',
            "shutil.",
            ".mkdir(",
            ".write_bytes(",
        },
        "the throwaway copy validation runs in (a temporary folder, never the project tree)",
    ),
    "agents/faces/cli/otel.py": (
        {".mkdir(", "os.open(", 'open(fd, "w"'},
        "the workspace folder of its store, and the receiver's token file in it (made once, "
        "exclusively, readable by its owner only), not a team or project file",
    ),
    "infrastructure/simulation/team.py": (
        {".mkdir("},
        "the folder a simulated team is copied into (the root itself; files go through "
        "atomic_write, which is confined)",
    ),
}


def _offending_calls(path: Path) -> set[str]:
    found: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        code = line.split("#", 1)[0]
        for match in WRITE_CALLS.finditer(code):
            found.add(match.group(0))
    return found


def test_nothing_but_the_confined_layer_writes_files() -> None:
    offenders: dict[str, set[str]] = {}
    for path in sorted((REPO / "infrastructure").rglob("*.py")) + sorted(
        (REPO / "agents").rglob("*.py")
    ):
        rel = path.relative_to(REPO).as_posix()
        calls = _offending_calls(path)
        allowed, _ = ALLOWED.get(rel, (set(), ""))
        if rel == "infrastructure/files/confined.py":
            continue
        extra = calls - allowed
        if extra:
            offenders[rel] = extra
    assert offenders == {}, f"file writes outside infrastructure/files/confined.py: {offenders}"


def test_the_grep_finds_a_write_it_should() -> None:
    sample = REPO / "tests" / "confined_writer_sample.txt"
    try:
        sample.write_text('Path("x").write_text("y")\nos.replace(a, b)\n', encoding="utf-8")
        assert _offending_calls(sample) == {".write_text(", "os.replace("}
    finally:
        sample.unlink()
