"""Issue 12: the generated secrets file is created private and atomically, never through a planted file."""

from __future__ import annotations

import os
import stat

from dispatchsite.secrets import SECRET_NAMES, load_secrets


def test_a_planted_temporary_file_is_neither_written_through_nor_kept(tmp_path):
    path = tmp_path / "secrets.json"
    bait = tmp_path / "readable-by-all"
    bait.write_text("")
    bait.chmod(0o644)
    # Another local user guesses the temporary name and plants a link to a file they can read.
    (tmp_path / f"{path.name}.{os.getpid()}.tmp").symlink_to(bait)
    data = load_secrets(path)
    assert set(data) == set(SECRET_NAMES)
    assert bait.read_text() == ""
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600 and not path.is_symlink()
    assert load_secrets(path) == data
