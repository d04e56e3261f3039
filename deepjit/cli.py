"""Command line: `python -m deepjit ls | stats | verify | clear | gc | knobs`.

Rule: the CLI reads the same knobs as the library (optionally under a library prefix), so
`PK_JIT_CACHE_DIR=... python -m deepjit --env-prefix PK_JIT_ ls` shows what that library sees.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import cache, maintenance
from .env import KNOBS, Environment
from .errors import DeepJitError

__all__ = ["main"]


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"


def _roots(args: argparse.Namespace, env: Environment) -> list[Path]:
    if args.cache_dir:
        return [Path(part).expanduser() for part in args.cache_dir.split(os.pathsep) if part]
    return list(env.settings().cache_roots)


def _cmd_ls(args: argparse.Namespace, env: Environment) -> int:
    rows = []
    now = time.time()
    shared = env.settings().shared
    for root in _roots(args, env):
        for entry in cache.iter_entries(root):
            manifest = entry.manifest(shared) or {}
            rows.append({
                "name": entry.name,
                "digest": entry.digest,
                "toolchain": manifest.get("toolchain", "?"),
                "kind": manifest.get("kind", "?"),
                "bytes": entry.size(),
                "last_used_s_ago": round(now - entry.last_used()),
                "committed": entry.committed,
                "path": str(entry.path),
            })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        flag = "" if row["committed"] else "  (uncommitted)"
        print(f"{row['name']:<32} {row['digest'][:16]}  {row['toolchain']}/{row['kind']:<9} "
              f"{_size(row['bytes']):>10}  used {row['last_used_s_ago']}s ago{flag}")
    return 0


def _cmd_stats(args: argparse.Namespace, env: Environment) -> int:
    report = maintenance.stats(_roots(args, env), env.settings().shared)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for root in report:
        if root["problem"] is not None:
            print(f"{root['root']}: UNSAFE, not looked into: {root['problem']}")
            continue
        print(f"{root['root']}: {root['entries']} entries, {_size(root['bytes'])}, "
              f"{root['broken']} broken ({root['unsafe']} unsafe), {root['temporary']} temporary, "
              f"{root['failed']} failed builds kept"
              f"{'' if root['writable'] else ' (read-only or missing)'}")
        for key, count in sorted(root["by_toolchain"].items()):
            print(f"  {key}: {count}")
    return 0


def _cmd_verify(args: argparse.Namespace, env: Environment) -> int:
    results = cache.verify(_roots(args, env), env.settings().shared)
    bad = [(entry, problem) for entry, problem in results if problem is not None]
    for entry, problem in bad:
        print(f"BAD {entry.path}: {problem}")
    print(f"{len(results)} entries checked, {len(bad)} bad" + ("; run `python -m deepjit gc` to remove them" if bad else ""))
    return 1 if bad else 0


def _cmd_clear(args: argparse.Namespace, env: Environment) -> int:
    removed = maintenance.clear(_roots(args, env), name=args.name, dry_run=args.dry_run, shared=env.settings().shared)
    verb = "would remove" if args.dry_run else "removed"
    for path in removed:
        print(f"{verb} {path}")
    print(f"{verb} {len(removed)} items")
    return 0


def _cmd_gc(args: argparse.Namespace, env: Environment) -> int:
    settings = env.settings()
    report = maintenance.gc(
        _roots(args, env),
        tmp_max_age_s=args.tmp_max_age if args.tmp_max_age is not None else settings.tmp_max_age_s,
        unused_for_s=args.unused_days * 86400 if args.unused_days is not None else None,
        max_bytes=int(args.max_mib * 1024 * 1024) if args.max_mib is not None else None,
        dry_run=args.dry_run,
        shared=settings.shared,
    )
    verb = "would remove" if args.dry_run else "removed"
    for path, reason in report.removed:
        print(f"{verb} {path}: {reason}")
    for path, reason in report.failed:
        print(f"could not remove {path}: {reason}", file=sys.stderr)
    print(f"{verb} {len(report.removed)} items, {_size(report.freed_bytes)} of entries")
    return 1 if report.failed else 0


def _cmd_knobs(args: argparse.Namespace, env: Environment) -> int:
    for knob, meaning in KNOBS.items():
        value, variable = env.lookup(knob)
        shown = f"{variable}={value}" if value is not None else "(unset)"
        print(f"{'|'.join(p + knob for p in env.prefixes):<40} {shown:<30} {meaning}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m deepjit", description="Inspect and maintain the deepjit build cache.")
    parser.add_argument("--cache-dir", help="cache roots separated by ':' (default: the knobs, then ~/.cache/deepjit)")
    parser.add_argument("--env-prefix", help="read knobs as PREFIX<NAME> before DEEPJIT_<NAME>, e.g. PK_JIT_")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list entries")
    ls.add_argument("--json", action="store_true")
    stats = sub.add_parser("stats", help="count entries, bytes and leftovers per root")
    stats.add_argument("--json", action="store_true")
    sub.add_parser("verify", help="check every entry's ownership, modes, marker, manifest and artifact sha256 "
                                  "(exit 1 if any is bad, 2 if a root cannot be trusted)")
    clear = sub.add_parser("clear", help="remove entries (all, or --name NAME)")
    clear.add_argument("--name", help="only entries compiled under this name")
    clear.add_argument("--dry-run", action="store_true")
    gc = sub.add_parser("gc", help="remove stale temp folders, broken or unsafe entries, unused or excess entries")
    gc.add_argument("--tmp-max-age", type=float, help="seconds (default: the TMP_MAX_AGE knob, 3600)")
    gc.add_argument("--unused-days", type=float, help="also remove entries not used for this many days")
    gc.add_argument("--max-mib", type=float, help="then remove least recently used entries beyond this size")
    gc.add_argument("--dry-run", action="store_true")
    sub.add_parser("knobs", help="show every environment knob and its current value")
    return parser


_COMMANDS = {"ls": _cmd_ls, "stats": _cmd_stats, "verify": _cmd_verify, "clear": _cmd_clear, "gc": _cmd_gc,
             "knobs": _cmd_knobs}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        env = Environment(args.env_prefix)
        return _COMMANDS[args.command](args, env)
    except DeepJitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
