"""Files a config names, kept inside the model's folder.

A config names files relative to its model folder (``default_model_filename``,
an output's ``label_filename``, a warm-up sample's ``input_data_file``, a
sequence state's ``initial_state.data_file``), and a RepositoryModelLoad
request may bring its own config: none of them may lead out of the folder.
The check is on the name itself (no absolute path, no ``..`` part, no NUL):
a symbolic link the repository's owner put inside the folder is theirs to
make, and is followed.
"""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath

from inferd.errors import ConfigError


def check_inside(name: str, what: str) -> str:
    """``name`` if it stays inside the model folder; ConfigError naming ``what`` and the value otherwise."""
    if not name:
        return name
    posix = PurePosixPath(name)
    if "\x00" in name or posix.is_absolute() or PureWindowsPath(name).is_absolute() or ".." in posix.parts \
            or ".." in PureWindowsPath(name).parts:
        raise ConfigError(f"{what} '{name[:200]}' must name a file inside the model's folder "
                          "(a relative path without '..')")
    return name
