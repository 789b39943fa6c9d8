"""``python -m dispatchsite.worker [options]``: a worker of this app through Celery's own ``worker`` command alone.

It takes the options of ``celery -A dispatchsite worker`` (it is that command) and starts the same worker.
What it leaves out is the rest of Celery's command line: ``celery`` imports every subcommand and every
installed plugin before it parses its arguments (Flower's with Tornado and prometheus_client, the amqp
shell's click-repl and prompt_toolkit), 0.25 s of CPU of a worker's 1 s start, paid again at each start
and restart. ``make run`` and the tests start their workers here; ``celery -A dispatchsite worker`` works
as before (``--detach`` only there: its re-exec names the ``celery`` command).
"""

from __future__ import annotations

import os
import sys

from celery import maybe_patch_concurrency


def main(argv: list[str] | None = None) -> None:
    """Run Celery's ``worker`` command on ``dispatchsite``'s app with ``argv`` (the process's own by default)."""
    args = sys.argv[1:] if argv is None else argv
    if argv is None:
        # Celery's SIGHUP restart (a stuck worker's, tasks.grouping) re-executes ``sys.executable + sys.argv``:
        # argv[0] as this file's path would run it as a script, whose folder shadows the celery package.
        sys.argv[:] = ["-m", "dispatchsite.worker", *args]
    if "-D" in args or "--detach" in args:
        sys.exit("dispatchsite.worker: --detach re-executes the celery command; use celery -A dispatchsite worker")
    maybe_patch_concurrency(["worker", *args])  # eventlet/gevent pools patch before anything else is imported
    # inner import: after the patch above, as celery's own entry point does
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    from dispatchsite.celery import app

    # The environment prefix `celery worker` has (CELERY_WORKER_<OPTION>), and the context its group makes.
    worker.main(args=args, prog_name="python -m dispatchsite.worker", auto_envvar_prefix="CELERY_WORKER",
                obj=CLIContext(app=app, no_color=bool(os.environ.get("NO_COLOR")), workdir=None))


if __name__ == "__main__":
    main()
