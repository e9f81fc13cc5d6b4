"""Two builds of Prism in one run: this checkout against another git revision.

Separate runs of ``run.py`` drift by ±15% on a shared VM, so a change is
judged by measuring both builds in the same run, their rounds taking turns
with the bare proxy's:

    python contrib/bench/compare.py 25dda01              # default and full profiles
    python contrib/bench/compare.py HEAD~3 --profile default --rounds 4

The other revision is checked out into a scratch worktree and served by the
same virtualenv with ``PYTHONPATH`` pointing at it (its core, plugins and
fake upstream come first on the path), so both builds run on the same
dependencies.  Targets: the bare proxy, then each profile before and after;
the table is ``run.py``'s, with every build's ratio to the bare proxy.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from proc import split_cpus
from profiles import write_full_profile
from run import (
    HOST,
    Target,
    find_wrk,
    format_table,
    free_port,
    in_scratch,
    measure,
    running_servers,
    server_env,
    start_bare_proxy,
    start_prism,
    start_upstream,
    wait_ready,
    write_prism_config,
)

REPO = Path(__file__).resolve().parents[2]


def worktree(revision: str, where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(where), revision],
        check=True,
        capture_output=True,
    )


def old_path(tree: Path, shadows: Path) -> str:
    """``PYTHONPATH`` that puts the other build's packages before the installed ones.

    First come ``shadows``: the plugins installed here that the other build
    does not have (see :func:`shadow_new_plugins`).
    """
    parts = [
        shadows,
        tree,
        *sorted((tree / "plugins").glob("prism-*")),
        tree / "contrib" / "fake-upstream",
    ]
    return ":".join(str(part) for part in parts)


def shadow_new_plugins(tree: Path, where: Path) -> list[str]:
    """Hide from the other build the plugins it does not have; return their names.

    Its core loads every installed ``prism_proxy`` entry point (pluggy reads
    every distribution's) before it reads ``disable =``: a plugin written
    after it would be imported against a core that lacks what the plugin
    needs.  An empty module of the same name in ``where``, put before the
    installed packages on that build's ``PYTHONPATH``, is what it loads
    instead: a plugin with no hooks, for that build only.
    """
    hidden = []
    for dist in importlib.metadata.distributions():
        for point in dist.entry_points:
            if point.group != "prism_proxy":
                continue
            module = point.value.split(":")[0]
            package = module.split(".")[0]
            if (tree / package).is_dir() or any((tree / "plugins").glob(f"*/{package}")):
                continue
            path = where.joinpath(*module.split("."))
            path.parent.mkdir(parents=True, exist_ok=True)
            for folder in (where / package, *path.parents):
                if folder == where or where not in folder.parents:
                    continue
                (folder / "__init__.py").touch()
            path.with_suffix(".py").write_text(
                '"""Not in the build under comparison: a plugin with no hooks."""\n'
            )
            hidden.append(str(dist.metadata["Name"]))
    return hidden


def compare(args: argparse.Namespace, wrk: str, work: Path) -> None:
    """Serve both builds beside the bare proxy, measure them in one run, print the table."""
    profiles = ("default", "full") if args.profile == "both" else (args.profile,)
    cpus = split_cpus()
    under_test, load = (None, None) if cpus is None else cpus
    tree = work / "before"
    worktree(args.revision, tree)
    try:
        with running_servers(work) as servers:
            upstream = free_port()
            start_upstream(servers, upstream, REPO, load)
            base = f"http://{HOST}:{upstream}/s/ok/v1"
            port = free_port()
            bare = start_bare_proxy(servers, port, base, REPO, under_test)
            wait_ready(bare, port, "/healthz")
            url = f"http://{HOST}:{port}/v1/chat/completions"
            targets = [Target("bare", "bare proxy", url, bare.proc.pid)]
            hidden = shadow_new_plugins(tree, work / "shadows")
            if hidden:
                print(f"not in {args.revision}, hidden from it: {', '.join(sorted(hidden))}")
            # A build without limits, cache or responses cannot serve today's full profile
            # (its keys CLI knows no limits, its core no cache section): both builds then
            # get the classic one, as with --classic.
            lacking = {f"prism-{name}" for name in ("limits", "cache", "responses")} & set(hidden)
            classic = args.classic or bool(lacking)
            if classic and "full" in profiles:
                why = "--classic" if args.classic else f"{args.revision} lacks {sorted(lacking)}"
                print(f"full profile: the classic one, for both builds ({why})")
            before = old_path(tree, work / "shadows")
            for build, pythonpath in (("before", before), ("after", None)):
                env = server_env()
                if pythonpath is not None:
                    env["PYTHONPATH"] = pythonpath
                for profile in profiles:
                    name = f"{profile}-{build}"
                    port = free_port()
                    here = work / name
                    here.mkdir()
                    key = None
                    if profile == "full":
                        ini, key = write_full_profile(here, port, base, env=env, classic=classic)
                    else:
                        ini = write_prism_config(here, port, base)
                    server = start_prism(servers, name, ini, under_test, env)
                    wait_ready(server, port, "/readyz")
                    url = f"http://{HOST}:{port}/v1/chat/completions"
                    label = f"{profile} {build}"
                    distinct = profile == "full" and not classic
                    targets.append(
                        Target(name, label, url, server.proc.pid, key_header=key, distinct=distinct)
                    )
            results = measure(
                wrk, targets, args.duration, args.warmup, args.rounds, sys.stdout, load
            )
            print(format_table(results))
            print(f"before = {args.revision}, after = this checkout (uncommitted changes too)")
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("revision", help="the git revision to compare this checkout against")
    parser.add_argument("--profile", choices=("default", "full", "both"), default="both")
    parser.add_argument(
        "--classic",
        action="store_true",
        help="the full profile without limits, cache and responses (chosen by itself when "
        "the other revision lacks one of them)",
    )
    parser.add_argument("--duration", type=int, default=3, help="seconds per round (3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per cell (3)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up seconds per cell (1)")
    args = parser.parse_args(argv)
    wrk = find_wrk(False)
    if wrk is None:
        print("wrk not found (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    return in_scratch("compare", lambda work: compare(args, wrk, work))


if __name__ == "__main__":
    raise SystemExit(main())
