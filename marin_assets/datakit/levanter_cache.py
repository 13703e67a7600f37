"""The Levanter cache format, without importing levanter: ``CacheWriter`` writes one (the zarr3 arrays
and ledger of ``levanter.store.SerialCacheWriter``, with tensorstore directly, on a local path or
``gs://``), ``check_cache`` verifies a finished one before it is read (a missing chunk would read as
token 0), ``is_finished_cache`` says whether its ledger is complete, and ``open_cache`` opens a split
with Levanter's own reader. ``tokenize`` and the chat caches write through it; the trainer's loader
and the dataset index check through it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from marin_assets.datakit.shards import join
from marin_assets.store.fsutil import kvstore_spec


def exemplar():
    import numpy as np

    return {"input_ids": np.zeros((0,), dtype=np.int32)}


# Levanter's jagged-array layout (levanter/store/jagged_array.py _get_spec): 2**54 rows,
# 128M-element shards of 256K-element blosc chunks. offsets[0] is the row count,
# offsets[i + 1] the end of row i in data.
_CHUNK, _WRITE_CHUNK = 256 * 1024, 256 * 1024 * 512
LEDGER_FILE = "shard_ledger.json"


def _zarr3_array(url: str, dtype: str):
    """A future of the created (emptied) array: tensorstore creates it on its own threads."""
    import tensorstore as ts

    metadata = {
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [_WRITE_CHUNK]}},
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {"chunk_shape": [_CHUNK], "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]},
            }
        ],
    }
    kvstore = kvstore_spec(url)
    if kvstore["driver"] == "file":
        # No fsync per write (tensorstore syncs by default): a cache is derived data, written
        # into the artifact store's staging folder like the Parquet shards, which are not
        # synced either. The store's manifest (each file's size, and sha256 up to 8 MiB),
        # checked on every load, finds a file a machine crash lost, and the step reruns. The
        # syncs cost 44 ms of 0.94 s tokenizing 6 shards of 1 MB (benchmarks/datakit.py).
        kvstore["file_io_sync"] = False
    spec = {"driver": "zarr3", "kvstore": kvstore, "metadata": metadata}
    return ts.open(spec, dtype=dtype, shape=[2**54], create=True, delete_existing=True)


class CacheWriter:
    """A Levanter cache of jagged int32 rows, one array pair per field (``{"input_ids"}`` by default; a chat
    cache adds ``loss_mask``, aligned token for token) on a local path or gs://, written with tensorstore:
    what SerialCacheWriter writes, without importing levanter (and jax, ray, datasets). The ledger
    (is_finished: the cache is complete) is written only on a clean exit."""

    def __init__(self, cache_dir: str, fields: tuple[str, ...] = ("input_ids",)):
        import os

        self.cache_dir = cache_dir if "://" in cache_dir else os.path.abspath(cache_dir)
        self.fields = fields
        # Created in the background (a few ms of file work per array, 4 arrays a tokenized
        # shard): the caller encodes its first batch meanwhile; the first write waits for them.
        self._opening = {
            f: (_zarr3_array(join(self.cache_dir, f, "offsets"), "int64"), _zarr3_array(join(self.cache_dir, f, "data"), "int32"))
            for f in fields
        }
        self._opened: dict | None = None
        self.rows = self.tokens = 0

    @property
    def _arrays(self) -> dict:
        """{field: (offsets, data)}, once created (raises what creating them raised)."""
        if self._opened is None:
            self._opened = {f: (offsets.result(), data.result()) for f, (offsets, data) in self._opening.items()}
        return self._opened

    def __enter__(self) -> CacheWriter:
        return self

    def write_batch(self, batch: dict) -> None:
        import numpy as np

        arrays = [np.asarray(a, dtype=np.int32) for a in batch["input_ids"]]
        if arrays:
            self.write_rows(np.concatenate(arrays), np.cumsum([a.size for a in arrays], dtype=np.int64))

    def write_rows(self, data, ends) -> None:
        """Append rows of a one-field cache given flat: ``data`` (int32) holds them back to back, ``ends``
        (int64) is where each one ends in ``data``."""
        (field,) = self.fields
        self.write_fields({field: data}, ends)

    def write_fields(self, columns: dict, ends) -> None:
        """Append rows given flat per field (``columns``: field -> int32 data, all of one length; ``ends``
        as in ``write_rows``): every field's rows end where the tokens' do."""
        import numpy as np

        if not len(ends):
            return
        if set(columns) != set(self.fields) or len({len(v) for v in columns.values()}) != 1:
            raise ValueError(
                f"CacheWriter: rows need every field of {self.fields} at one length, got "
                f"{ {k: len(v) for k, v in columns.items()} }"
            )
        ends = self.tokens + np.asarray(ends, np.int64)
        rows = self.rows + len(ends)
        # The tokens first (each array its own file: written at once), then the offsets: the
        # ends and the row count offsets[0], which makes the rows visible.
        written = [
            data[self.tokens : self.tokens + len(columns[field])].write(np.asarray(columns[field], np.int32))
            for field, (_, data) in self._arrays.items()
        ]
        for future in written:
            future.result()
        self._write_offsets(ends, rows)
        self.rows, self.tokens = rows, int(ends[-1])

    def _write_offsets(self, ends, rows: int) -> None:
        """Each field's ``ends`` after its rows so far and its row count ``rows``. Below
        _WRITE_CHUNK rows both sit in the offsets' first shard file: one transaction writes
        that file once (a reader sees the batch whole or not at all), a write less a batch than
        ends-then-count. Beyond it, the ends are written first, then the count."""
        import tensorstore as ts

        if rows < _WRITE_CHUNK:
            txn = ts.Transaction()
            pending = []  # a tensorstore write whose future is dropped is cancelled: keep them to the commit
            for offsets, _ in self._arrays.values():
                view = offsets.with_transaction(txn)
                pending += [view[self.rows + 1 : rows + 1].write(ends), view[0].write(rows)]
            txn.commit_async().result()
            for future in pending:
                future.result()
            return
        for future in [offsets[self.rows + 1 : rows + 1].write(ends) for offsets, _ in self._arrays.values()]:
            future.result()
        for offsets, _ in self._arrays.values():
            offsets[0].write(rows).result()

    def __exit__(self, exc_type, exc, tb) -> None:
        import fsspec

        if exc_type is None:
            self._arrays  # noqa: B018 - created for certain (an empty split too) before the ledger says finished
            ledger = {
                "total_num_rows": self.rows,
                "shard_rows": {"": self.rows},
                "is_finished": True,
                "finished_shards": [""],
                "field_counts": {},
                "metadata": {"preprocessor_metadata": None},
            }
            fs, path = fsspec.core.url_to_fs(join(self.cache_dir, LEDGER_FILE))
            fs.pipe_file(path, json.dumps(ledger).encode())


def _ledger_rows(cache_dir: str) -> int:
    """The row count of a finished cache's ledger; ValueError naming the ledger when it is missing,
    unreadable or does not say is_finished (a killed or failed write has no ledger)."""
    import fsspec

    path = join(cache_dir, LEDGER_FILE)
    fs, root = fsspec.core.url_to_fs(path)
    try:
        ledger = json.loads(fs.cat_file(root))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing: the write failed or was killed") from None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(ledger, dict) or ledger.get("is_finished") is not True:
        raise ValueError(f"{path}: does not say is_finished: the write failed or was killed")
    rows = ledger.get("total_num_rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"{path}: total_num_rows is {rows!r}, not a row count")
    return rows


def _missing_chunk(cache_dir: str, field: str, tokens: int) -> str | None:
    """The first data chunk file of ``field`` that holds some of its ``tokens`` and is missing: tensorstore
    reads a missing zarr chunk as the fill value, 0, which is a valid token id. Needs zarr3's default
    chunk keys (c/<i>, what CacheWriter and Levanter write); other layouts are not checked."""
    import fsspec

    meta_path = join(cache_dir, field, "data", "zarr.json")
    try:
        fs, path = fsspec.core.url_to_fs(meta_path)
        meta = json.loads(fs.cat_file(path))
        (chunk,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
        encoding = meta.get("chunk_key_encoding", {"name": "default"})
    except FileNotFoundError:
        return f"{meta_path}: missing"
    except (ValueError, KeyError, TypeError):
        return f"{meta_path}: not zarr3 metadata of a one-dimensional array"
    if encoding.get("name") != "default" or encoding.get("configuration", {}).get("separator", "/") != "/":
        return None
    fs, _ = fsspec.core.url_to_fs(cache_dir)
    for i in range(-(-tokens // int(chunk))):
        key = join(cache_dir, field, "data", "c", str(i))
        if not fs.exists(fsspec.core.url_to_fs(key)[1]):
            return f"{key}: missing (tokens {i * chunk}..{min(tokens, (i + 1) * chunk)} would read as 0)"
    return None


def check_cache(
    cache_dir: str, fields: Sequence[str] = ("input_ids",), rows: int | None = None, tokens: int | None = None
) -> tuple[int, int]:
    """(rows, tokens) of a finished cache whose parts agree: its ledger says is_finished, each field's
    offsets hold the ledger's row count and the tokens' end (``rows``/``tokens`` too, when given: what an
    index says of it), and every data chunk holding those tokens exists. ValueError naming the file and
    the reason otherwise, so a damaged cache is refused before it is read as zeros."""
    import tensorstore as ts

    ledger_rows = _ledger_rows(cache_dir)
    ends = {}
    for field in fields:
        where = join(cache_dir, field, "offsets")
        try:
            offsets = ts.open({"driver": "zarr3", "kvstore": kvstore_spec(where)}, open=True, read=True).result()
            stored_rows = int(offsets[0].read().result())
            ends[field] = int(offsets[stored_rows].read().result()) if stored_rows else 0
        except (ValueError, IndexError) as e:  # tensorstore's errors are ValueErrors
            raise ValueError(f"{where}: unreadable ({str(e).splitlines()[0]})") from None
        if stored_rows != ledger_rows:
            raise ValueError(f"{where}: holds {stored_rows} rows, its {LEDGER_FILE} says {ledger_rows}")
        if rows is not None and stored_rows != rows:
            raise ValueError(f"{where}: holds {stored_rows} rows, the index says {rows}")
        if tokens is not None and ends[field] != tokens:
            raise ValueError(f"{where}: holds {ends[field]} tokens, the index says {tokens}")
        missing = _missing_chunk(cache_dir, field, ends[field])
        if missing:
            raise ValueError(missing)
    if len(set(ends.values())) > 1:
        raise ValueError(f"{cache_dir}: its fields hold different token counts {ends}")
    return ledger_rows, ends[fields[0]]


def is_finished_cache(cache_dir: str) -> bool:
    """True when the cache's ledger says every row was written (a killed or failed write has
    no ledger: such a cache must not be trained on)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(join(cache_dir, LEDGER_FILE))
    try:
        return json.loads(fs.cat_file(root)).get("is_finished") is True
    except (FileNotFoundError, ValueError, AttributeError):
        return False


def open_cache(cache_dir: str):
    """Open one split with Levanter's own reader (TreeCache.load)."""
    from levanter.store.cache import TreeCache

    return TreeCache.load(cache_dir, exemplar())
