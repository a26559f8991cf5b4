"""`tessera-launch -- CMD ARGS...`: run CMD confined to the pod's GPU slice, with no LD_PRELOAD.

It reads the assignment through the downward API (gpu_sharing.assignment), sets the visible
devices, the memory fraction and (where MPS runs) the SM share, and replaces itself with CMD
(exec: signals and the exit code are CMD's own). A Python CMD gets PyTorch's memory capped by
the sitecustomize in gpu_sharing/_boot, which tessera-launch puts first on PYTHONPATH.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys

from .assignment import AssignmentError, read_assignment
from .enforce import slice_environment

USAGE = "usage: tessera-launch [--verbose] -- COMMAND [ARGS...]"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    while args and args[0] != "--":
        if args[0] in ("-v", "--verbose"):
            verbose = True
            args.pop(0)
        elif args[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        elif args[0].startswith("-"):  # a command named "-x" goes after "--"; a mistyped flag is no command
            print(f"tessera-launch: unknown option {args[0]}; {USAGE}", file=sys.stderr)
            return 2
        else:
            break
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        print(f"tessera-launch: no command given; {USAGE}", file=sys.stderr)
        return 2
    try:
        a = read_assignment(os.environ)
    except AssignmentError as e:
        print(f"tessera-launch: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    changes = slice_environment(a, env)
    env.update(changes)
    if verbose:
        env["TESSERA_LAUNCH_VERBOSE"] = "1"
        print(f"tessera-launch: {a.source}: " + " ".join(f"{k}={v}" for k, v in sorted(changes.items())), file=sys.stderr)
    program = shutil.which(args[0], path=env.get("PATH"))
    if program is None and os.sep in args[0] and os.path.exists(args[0]):  # a path that is there, but no program
        print(f"tessera-launch: cannot run {args[0]}: not an executable file", file=sys.stderr)
        return 126
    if program is None:
        print(f"tessera-launch: command not found: {args[0]}", file=sys.stderr)
        return 127
    try:
        os.execve(program, args, env)
    except OSError as e:  # exit codes as a shell's: 126, found but cannot be run (no #!, a missing #! interpreter)
        hint = {errno.ENOEXEC: "; a script needs a #! line naming its interpreter",
                errno.ENOENT: "; is the interpreter its #! line names installed?"}.get(e.errno, "")
        print(f"tessera-launch: cannot run {args[0]}: {e.strerror}{hint}", file=sys.stderr)
        return 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
