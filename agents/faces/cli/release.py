"""``agentmend release ...``: show and steer a team's releases and their rollouts.

    agentmend release list                 versions, newest first, with what serves now
    agentmend release show 3               one release: parent, changes, files, its rollout
    agentmend release diff 2 3             what changed between two releases
    agentmend release publish              publish the workspace's team folder as a release
    agentmend release canary 3 --share .1  serve release 3 to 10 % of runs, judged on live runs
    agentmend release promote 3            make the canary stable now          (administrator)
    agentmend release abort 3              roll the canary back, or the stable one fleet-wide
    agentmend release pause 3 [--resume]   stop (or resume) serving the canary (administrator)
    agentmend release trust [NAME]         whose labelled runs count; trust NAME (administrator)

The team is the workspace's (its id is in ``<team>/.agent/team-id``). Steps are audited with the
principal of the settings (``AGENTMEND_PRINCIPAL_*``); promote, abort and pause need an admin.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from agentmend.faces.cli.commands import console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
)

__all__ = ["SUBCOMMANDS"]

_DECIDERS = {  # a rollout's ``decided_by``, in words
    "failure_guard": "the guard: more than its share of the window's failures",
    "slowness_guard": "the guard: more than its share of the window's slow runs",
    "two_sample": "the two-sample test",
    "limits": "the limits (undecided at the last run or hour)",
    "administrator": "an administrator",
    "publication": "a stable publication that superseded it",
    "evidence": "the evidence",
}


@contextlib.contextmanager
def _releases(args: argparse.Namespace) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(workspace, release log, rollouts, principal) of the workspace's team; one-line errors."""
    from agentmend.infrastructure.definitions.team_id import team_id_for
    from agentmend.infrastructure.errors import InvalidArgument, NotFound, PermissionRequired
    from agentmend.infrastructure.releases.errors import ReleaseRefused, RolloutConflict
    from agentmend.infrastructure.releases.log import ReleaseLog
    from agentmend.infrastructure.releases.rollout import Rollouts

    with open_workspace(args) as workspace:
        log = ReleaseLog(
            workspace.store, team_id_for(workspace.team_dir), audit=workspace.manager.audit
        )
        try:
            yield workspace, log, Rollouts(log), workspace.settings.default_principal
        except PermissionRequired as exc:
            raise CommandError(
                f"{exc} (set AGENTMEND_PRINCIPAL_ADMIN=true for an administrator)", EXIT_USAGE
            ) from exc
        except (NotFound, InvalidArgument) as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        except (RolloutConflict, ReleaseRefused) as exc:
            raise CommandError(str(exc), EXIT_PROBLEM) from exc


def _version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("version", type=int, help="the release's version number")


def _release_data(release: Any) -> dict[str, Any]:
    data = asdict(release)
    data["files"] = dict(release.files)
    return data


# -- list / show / diff -------------------------------------------------------------------------


def _run_list(args: argparse.Namespace) -> int:
    with _releases(args) as (_, log, rollouts, _):
        heads = log.heads()
        releases = log.list(limit=args.limit)
        active = rollouts.active()
        rolled_back = {r.canary: r for r in rollouts.rolled_back(limit=args.limit)}
    if args.json:
        print_json(
            {
                "team": log.team_id,
                "heads": asdict(heads),
                "rollout": _rollout_data(active),
                "releases": [_release_data(r) for r in releases],
            }
        )
        return EXIT_OK
    out = console()
    if not releases:
        out.print("no release published yet (agentmend release publish)")
        return EXIT_OK
    from rich.table import Table

    table = Table(title=f"Releases of team {log.team_id}")
    for column in ("version", "hash", "parent", "serving", "reason", "changes"):
        table.add_column(column, justify="right" if column in ("version", "parent") else "left")
    for release in releases:
        if release.version == heads.stable:
            role = "stable"
        elif release.version == heads.canary:
            role = f"canary {heads.share:.0%}"
        elif release.version in rolled_back:  # a canary that was rolled back: why, in a word
            role = f"rolled back ({rolled_back[release.version].reason or 'by hand'})"
        else:
            role = "-"
        table.add_row(
            str(release.version),
            release.content_hash[:12],
            str(release.parent or "-"),
            role,
            release.reason,
            ", ".join(release.change_ids) or "-",
        )
    out.print(table)
    return EXIT_OK


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=30, help="at most this many (default 30)")


def _rollout_data(record: Any) -> dict[str, Any] | None:
    if record is None:
        return None
    data = asdict(record)
    data["evidence"] = record.evidence.summary(record.limits)
    return data


def _run_show(args: argparse.Namespace) -> int:
    with _releases(args) as (_, log, rollouts, _):
        release = log.get(args.version)
        rollout = rollouts.of_release(args.version)
        heads = log.heads()
    if args.json:
        print_json({"release": _release_data(release), "rollout": _rollout_data(rollout)})
        return EXIT_OK
    out = console()
    serving = (
        "stable" if heads.stable == release.version else
        "canary" if heads.canary == release.version else "not served"
    )  # fmt: skip
    out.print(f"release {release.version} of {release.team_id} ({serving})")
    out.print(f"  hash     {release.content_hash}")
    out.print(f"  parent   {release.parent if release.parent is not None else '-'}")
    out.print(f"  changes  {', '.join(release.change_ids) or '-'}")
    out.print(f"  reason   {release.reason} (by {release.published_by})")
    for path, sha in release.files:
        out.print(f"  {sha[:12]}  {path}")
    if rollout is not None:
        summary = rollout.evidence.summary(rollout.limits)
        out.print(f"  rollout  {rollout.rollout_id}: {rollout.state} {rollout.reason or ''}")
        if rollout.evidence.decided_by:
            out.print(f"  decided  by {_DECIDERS.get(rollout.evidence.decided_by, '?')}")
        out.print(f"           {summary}")
    return EXIT_OK


def _diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=int, help="the older release")
    parser.add_argument("new", type=int, help="the newer release")


def _run_diff(args: argparse.Namespace) -> int:
    with _releases(args) as (_, log, _, _):
        diff = log.diff(args.old, args.new)
    if args.json:
        print_json(asdict(diff))
    else:
        console().print(diff.text or "(no difference)", markup=False, highlight=False)
    return EXIT_OK


# -- publish / canary ---------------------------------------------------------------------------


def _publish_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--change", action="append", default=[], help="a change id it carries")
    parser.add_argument("--reason", default="published by hand", help="why (kept in the audit)")


def _run_publish(args: argparse.Namespace) -> int:
    with _releases(args) as (workspace, log, _, who):
        release = log.publish_directory(
            workspace.team_dir, by=who, change_ids=tuple(args.change), reason=args.reason
        )
    if args.json:
        print_json(_release_data(release))
    else:
        console().print(f"published release {release.version} ({release.content_hash[:12]})")
    return EXIT_OK


def _canary_arguments(parser: argparse.ArgumentParser) -> None:
    _version(parser)
    parser.add_argument("--share", type=float, default=0.10, help="share of runs (default 0.1)")
    parser.add_argument("--claimed-fix", action="store_true", help="promote only when shown better")


def _run_canary(args: argparse.Namespace) -> int:
    with _releases(args) as (_, _, rollouts, who):
        record = rollouts.start(
            args.version, by=who, share=args.share, claimed_fix=args.claimed_fix
        )
    if args.json:
        print_json(_rollout_data(record))
    else:
        console().print(
            f"release {record.canary} serves {record.share:.0%} of runs ({record.rollout_id})"
        )
    return EXIT_OK


# -- promote / abort / pause --------------------------------------------------------------------


def _run_promote(args: argparse.Namespace) -> int:
    with _releases(args) as (_, _, rollouts, who):
        record = rollouts.promote(args.version, by=who)
    if args.json:
        print_json(_rollout_data(record))
    else:
        console().print(f"release {record.canary} is stable ({record.rollout_id})")
    return EXIT_OK


def _run_abort(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.releases.log import Release

    with _releases(args) as (_, _, rollouts, who):
        outcome = rollouts.abort(args.version, by=who)
    if isinstance(outcome, Release):
        data: dict[str, Any] | None = _release_data(outcome)
        text = f"rolled back fleet-wide: release {outcome.version} ({outcome.reason})"
    else:
        data = _rollout_data(outcome)
        text = f"canary {outcome.canary} rolled back; stable stays {outcome.stable}"
    if args.json:
        print_json(data)
    else:
        console().print(text)
    return EXIT_OK


def _pause_arguments(parser: argparse.ArgumentParser) -> None:
    _version(parser)
    parser.add_argument("--resume", action="store_true", help="serve the canary again")


def _run_pause(args: argparse.Namespace) -> int:
    with _releases(args) as (_, _, rollouts, who):
        record = rollouts.pause(args.version, by=who, resume=args.resume)
    if args.json:
        print_json(_rollout_data(record))
    else:
        console().print(f"rollout {record.rollout_id} of release {record.canary}: {record.state}")
    return EXIT_OK


# -- trust ------------------------------------------------------------------------------------


def _trust_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", metavar="NAME", help="a receiver's name (otel receive --name)"
    )
    parser.add_argument(
        "--remove", action="store_true", help="stop trusting NAME (an administrator's step)"
    )


def _run_trust(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.releases.attribution import read_trusted, set_trusted
    from agentmend.infrastructure.releases.rollout_evidence import trusted_receivers

    with _releases(args) as (workspace, log, _, who):
        changed = None
        if args.name is not None:
            changed = set_trusted(
                log.store, workspace.manager.audit, args.name, by=who, trusted=not args.remove
            )
        elif args.remove:
            raise CommandError("--remove needs the NAME of a receiver", EXIT_USAGE)
        stored, here = read_trusted(log.store), trusted_receivers()
    if args.json:
        print_json({"changed": changed, "store": sorted(stored), "environment": sorted(here)})
        return EXIT_OK
    out = console()
    if changed is not None:
        verb = "no longer trusted" if args.remove else "trusted"
        out.print(f"{args.name}: {verb}" + ("" if changed else " (already so)"), markup=False)
    out.print(f"trusted by the store: {', '.join(sorted(stored)) or '-'}", markup=False)
    out.print(
        f"trusted here ($AGENTMEND_TRUSTED_RECEIVERS): {', '.join(sorted(here)) or '-'}",
        markup=False,
    )
    return EXIT_OK


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("release", "list"),
        help="the team's releases, newest first, and which is stable or canary",
        example="agentmend release list --workspace ./ws",
        add_arguments=_list_arguments,
        run=_run_list,
        json_output=True,
    ),
    Subcommand(
        path=("release", "show"),
        help="one release: parent, changes, file hashes, and its rollout's evidence",
        example="agentmend release show 3 --json",
        add_arguments=_version,
        run=_run_show,
        json_output=True,
    ),
    Subcommand(
        path=("release", "diff"),
        help="what changed between two releases (a unified diff)",
        example="agentmend release diff 2 3",
        add_arguments=_diff_arguments,
        run=_run_diff,
        json_output=True,
    ),
    Subcommand(
        path=("release", "publish"),
        help="publish the workspace's team folder as the next release",
        example="agentmend release publish --reason 'raised max_tokens'",
        add_arguments=_publish_arguments,
        run=_run_publish,
        json_output=True,
    ),
    Subcommand(
        path=("release", "canary"),
        help="serve a release to a share of runs; live runs promote or roll it back",
        example="agentmend release canary 3 --share 0.1",
        add_arguments=_canary_arguments,
        run=_run_canary,
        json_output=True,
    ),
    Subcommand(
        path=("release", "promote"),
        help="as an administrator, make the current canary the stable release now",
        example="agentmend release promote 3",
        add_arguments=_version,
        run=_run_promote,
        json_output=True,
    ),
    Subcommand(
        path=("release", "abort"),
        help="as an administrator, roll back the canary, or the stable release fleet-wide",
        example="agentmend release abort 3",
        add_arguments=_version,
        run=_run_abort,
        json_output=True,
    ),
    Subcommand(
        path=("release", "trust"),
        help="the receivers whose release-labelled runs count in a rollout; as an "
        "administrator, trust NAME (or --remove it)",
        example="agentmend release trust gateway-1",
        add_arguments=_trust_arguments,
        run=_run_trust,
        json_output=True,
    ),
    Subcommand(
        path=("release", "pause"),
        help="as an administrator, stop serving the canary (evidence kept), or --resume",
        example="agentmend release pause 3",
        add_arguments=_pause_arguments,
        run=_run_pause,
        json_output=True,
    ),
)
