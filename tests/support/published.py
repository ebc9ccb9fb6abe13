"""Text that other packages publish, fetched from the package index at test time (this project
keeps only what it wrote), and kept in the test virtualenv once fetched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

#: Where fetched text is kept: the virtualenv the tests run in, so a fresh one fetches anew.
CACHE = Path(sys.prefix) / "published"


def readme_of(package: str, version: str) -> str:
    """The README of ``package==version`` as its wheel carries it: the long description in the
    wheel's METADATA (what PyPI shows), from ``pip download``."""
    kept = CACHE / f"{package}-{version}-README.md"
    if not kept.exists():
        with tempfile.TemporaryDirectory() as folder:
            wheel = _downloaded(package, version, "--only-binary", Path(folder))
            with zipfile.ZipFile(wheel) as archive:
                (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
                text = archive.read(metadata).decode("utf-8")
        # The headers, an empty line, then the long description.
        readme = text.split("\n\n", 1)[1]
        CACHE.mkdir(exist_ok=True)
        # Written aside, then moved: test processes that fetch at once never read half a file.
        partial = kept.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(readme)
        os.replace(partial, kept)
    return kept.read_text()


def sdist_of(package: str, version: str) -> Path:
    """The unpacked source distribution of ``package==version`` (its tests among it), from
    ``pip download``."""
    kept = CACHE / f"{package}-{version}-sdist"
    if not kept.exists():
        CACHE.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as folder:
            archive = _downloaded(package, version, "--no-binary", Path(folder))
            unpacked = Path(folder) / "unpacked"
            with tarfile.open(archive) as sdist:
                sdist.extractall(unpacked, filter="data")
            (root,) = unpacked.iterdir()
            # Moved into place whole: test processes that fetch at once never see half of it.
            try:
                os.replace(root, kept)
            except OSError:  # another process put it there first
                shutil.rmtree(root)
    return kept


def _downloaded(package: str, version: str, form: str, folder: Path) -> Path:
    """The one file ``pip download`` puts in ``folder``: the wheel (``form="--only-binary"``)
    or the source distribution (``"--no-binary"``) of ``package==version``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps",
         form, ":all:", "--quiet", "--dest", str(folder)],
        check=True,
    )  # fmt: skip
    (downloaded,) = folder.iterdir()
    return downloaded
