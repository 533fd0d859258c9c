"""One exception type for every user-facing problem, so the CLI can print it as one line."""

from __future__ import annotations

import errno
from contextlib import contextmanager

# What the filesystem answers when it cannot take a write: full, quota, file-size limit,
# read-only, not permitted. Other OSErrors are bugs or transient and keep their traceback.
WRITE_REFUSALS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


class LayerwaveError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""


@contextmanager
def store_writes(store: str):
    """Turn a filesystem's refusal to write into one clear LayerwaveError.

    Every write to a store goes through here, so a full disk or a read-only store gives the same
    message wherever it strikes, and Prefect does not retry what a retry cannot fix. The OSError
    stays chained as the cause for `layerwave --debug`.
    """
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_REFUSALS:
            raise
        reason = f"{err.strerror} ({errno.errorcode[err.errno]})"
        raise LayerwaveError(
            f"writing to store {store} failed: {reason}; free space on its disk or make it writable, "
            "then re-run the same command to resume (committed shards are kept)"
        ) from err


# zarr's crc32c codec on a corrupted chunk; zstd on one stored without a checksum (older stores' labels)
DAMAGED_CHUNK = ("Stored and computed checksum do not match", "Zstd decompression error")


def is_damaged_chunk(err: BaseException) -> bool:
    return isinstance(err, (ValueError, RuntimeError)) and any(message in str(err) for message in DAMAGED_CHUNK)


def is_user_error(err: BaseException) -> bool:
    """Problems the user fixes, whose message says it all: no traceback unless asked for."""
    return isinstance(err, LayerwaveError) or is_damaged_chunk(err)
