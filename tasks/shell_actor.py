"""Who ran a management command, for the audit trail of operator actions."""

from __future__ import annotations

import os
import pwd


def shell_actor() -> str:
    """``shell:<name>`` of the process's real user id.

    Not ``$USER`` / ``$LOGNAME`` (``getpass.getuser()`` reads those first): any
    caller can set them, and the audit trail would name whoever they chose.
    """
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry (containers)
        name = f"uid:{uid}"
    return f"shell:{name}"
