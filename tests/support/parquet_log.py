"""What a Spark file sink committed: the files its ``_spark_metadata`` log lists, read with
pyarrow (no SparkSession needed). Files of failed attempts are left out, as Spark does."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq


def committed_files(out: Path) -> list[Path]:
    added: set[str] = set()
    deleted: set[str] = set()
    log = out / "_spark_metadata"
    for entry in sorted(log.iterdir()) if log.is_dir() else []:
        if entry.name.startswith(".") or entry.name.endswith(".crc"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # the first line is the version
            item = json.loads(line)
            (deleted if item.get("action") == "delete" else added).add(item["path"])
    return sorted(Path(unquote(urlsplit(path).path)) for path in added - deleted)


def committed_column(out: Path, column: str) -> list[bytes]:
    values: list[bytes] = []
    for path in committed_files(out):
        values.extend(pq.read_table(path, columns=[column]).column(column).to_pylist())
    return values
