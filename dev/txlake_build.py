"""txlake's PEP 517 build backend: setuptools' own (``setuptools.build_meta``), plus a static
``sys.path`` entry in editable installs so that PySpark finds the ``txlake`` data source.

PySpark registers Python data sources by discovery: a worker imports every top-level module
named ``pyspark_*`` that ``pkgutil.iter_modules()`` lists (``pyspark/sql/worker/
lookup_data_sources.py``) and registers its ``DefaultSource``. ``iter_modules`` walks the
folders on ``sys.path`` only. setuptools' default editable install (``pip install -e .``)
serves txlake through an import hook instead -- a ``sys.meta_path`` finder, because txlake's
folders do not mirror its package names (``engine/`` is ``txlake.engine``) -- so the worker
found ``pyspark_txlake`` only when Spark ran in the checkout root, whose path the worker has
on ``sys.path``; anywhere else ``format("txlake")`` failed with DATA_SOURCE_NOT_FOUND.
setuptools' other editable modes do not help: ``compat`` puts the checkout root itself on
``sys.path`` (``txlake.engine`` is then not importable at all, and ``engine``, ``tests``, ...
become top-level modules); ``strict`` puts a tree of links under ``build/`` on ``sys.path``
(then ``import txlake.engine`` fails in the checkout root, where the folder ``txlake/``
shadows the tree, and every new module needs a reinstall).

So :func:`build_editable` builds setuptools' editable wheel and adds one file to it,
``txlake-spark-discovery.pth``, whose single line is the absolute path of the checkout's
``spark_discovery/`` folder. That folder holds the ``pyspark_txlake`` package and nothing
else, so the entry adds exactly one top-level module, and it stays live (no copy). pip
records the file in the installation's RECORD, so ``pip uninstall`` removes it. Regular
(non-editable) wheels and sdists are setuptools' unchanged: they install ``pyspark_txlake``
as a package in site-packages, which ``iter_modules`` sees anyway.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every hook but build_editable is setuptools'

#: the folder holding only ``pyspark_txlake`` (pyproject.toml maps the package there)
DISCOVERY_FOLDER = Path(__file__).resolve().parent.parent / "spark_discovery"
#: the path file added to editable wheels
PTH_NAME = "txlake-spark-discovery.pth"


def build_editable(wheel_directory: str, config_settings: dict | None = None,
                   metadata_directory: str | None = None) -> str:
    """PEP 660's hook: setuptools' editable wheel plus :data:`PTH_NAME` (see the module docstring).

    Returns:
        the wheel's file name in ``wheel_directory``, as PEP 660 requires.
    """
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_path_file(os.path.join(wheel_directory, name), PTH_NAME, DISCOVERY_FOLDER)
    return name


def add_path_file(wheel_path: str, pth_name: str, folder: Path) -> None:
    """Rewrite the wheel at ``wheel_path`` with a ``.pth`` file naming ``folder`` at its root,
    listed in the wheel's RECORD with its sha256 and size (PEP 376/427).

    Raises:
        ValueError: the wheel has no ``<name>.dist-info/RECORD``.
    """
    content = f"{folder}\n".encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    tmp = f"{wheel_path}.tmp"
    with zipfile.ZipFile(wheel_path) as src:
        infos = src.infolist()
        records = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise ValueError(f"{wheel_path}: expected one <name>.dist-info/RECORD, found {len(records)}")
        record = records[0]
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in infos:
                if info is not record:
                    dst.writestr(info, src.read(info))
            dst.writestr(pth_name, content)
            listed = src.read(record).decode().rstrip("\n")
            dst.writestr(record, f"{listed}\n" * bool(listed) + f"{pth_name},sha256={digest},{len(content)}\n")
    os.replace(tmp, wheel_path)
