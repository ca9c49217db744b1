"""A publisher for the race tests: publishes releases of one team as fast as it can.

    python tests/release_publisher.py URL FILES_DIR TEAM_ID SOURCE GO_FILE COUNT TAG

Prints ``READY`` and waits until GO_FILE exists (so two publishers start together), then
publishes COUNT stable releases of the team folder SOURCE, each with one line added to an agent
file (``TAG i``), with no audit chain (the audit's own lock would serialize the publishers; the
release head's lock is what is under test). Prints ``PUBLISHED version parent`` after each
publication returned.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agentmend.infrastructure.principal import Principal  # noqa: E402
from agentmend.infrastructure.releases.content import read_team_files  # noqa: E402
from agentmend.infrastructure.releases.log import ReleaseLog  # noqa: E402
from agentmend.infrastructure.store.api import Store  # noqa: E402

AGENT_FILE = "research-agent.md"


def main() -> None:
    url, files_dir, team, source, go, count, tag = sys.argv[1:8]
    store = Store(url, files_dir=files_dir)
    log = ReleaseLog(store, team, audit=False)  # unaudited: only the store serializes them
    files = read_team_files(source)
    who = Principal(f"publisher-{tag}", tag)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go")
        time.sleep(0.001)
    for i in range(int(count)):
        edited = dict(files)
        edited[AGENT_FILE] = files[AGENT_FILE] + f"\n<!-- {tag} {i} -->\n".encode()
        release = log.publish(edited, by=who, reason=f"{tag} {i}", stable=True)
        print(f"PUBLISHED {release.version} {release.parent}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
