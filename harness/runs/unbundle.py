"""`remax-bench unbundle NAME.tar.gz --out DIR`: a bundle (harness.runs.bundle) opened on another machine
(docs/reproducibility.md, "Publishing a comparison: the bundle").

A bundle is downloaded from someone else, so nothing in it is trusted. Every entry is checked before it is written,
into a folder of its own that appears only when every file matched bundle.json, and the decompressed bytes are
bounded as they arrive: a bundle that would fill the disk (a decompression bomb) is refused once RATIO_FLOOR (16 MiB)
of it is out, not after gigabytes.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, cast

from harness import HarnessError
from harness.io import MAX_DOCUMENT_BYTES, atomic_path, parse_document, read_json_object
from harness.results.records import INTEGER, LIST, OBJECT, TEXT, check_shape

TOP = "remax-bench-bundle"
RECORD = "bundle.json"
FORMAT = 1
OWNER = {"kind": "bundle"}  # what an opened bundle's folder is (harness.io.OWNER)
BUNDLE_SHAPE = {"format": INTEGER, "created": TEXT, "runs": LIST, "runs.*": OBJECT, "inputs": OBJECT,
                "environments": OBJECT, "files": OBJECT, "files.*": TEXT}

# Bounds on what opening a bundle may write. A profile's bundle is 1-2 MB holding about as much (the default
# profile's with one run: 0.58 MB holding 0.95 MB of files; #50's cpu-frameworks one, 15 runs: 2.2 MB), and the
# largest file any profile bundles is the a100x8 profile's dataset, the ~125,000 HH-RLHF prompts as JSON lines (about
# 100 MB, an estimate). Each cap is ten times or more what a real bundle reaches, so a bundle past one is damage or a
# decompression bomb, stopped before it fills the disk.
MAX_ENTRY_BYTES = 1 << 30  # one file
MAX_BYTES = 4 << 30  # all files together
MAX_MEMBERS = 100_000
# Decompressed bytes over the compressed bytes read so far, measured once RATIO_FLOOR bytes are out (small files of
# JSON and text compress 3-13 times each; a bundle of only them never reaches the floor). Measured, gzip -9 as
# `bundle` writes: 1.6 for the default profile's bundle (a model most of it), 3.0 for the tests' tiny one; 7.8 for its
# generated dataset and 13 for its eval.json, the most compressible files in them; 81 for a dataset whose every prompt
# starts with one 1.8 kB instruction, 154 for one whose every prompt is the same. gzip reaches about 1,030 at most (on
# zeros), so a bomb of zeros stops at the floor, and one of anything else writes at most MAX_RATIO times what it read
# (then MAX_BYTES stops it).
MAX_RATIO = 200
RATIO_FLOOR = 16 << 20
# The most of the decompressed tar read at once: a file is read a CHUNK at a time, so a larger read is a header's
# (a pax or GNU long name header), which tarfile would hold in memory whole.
MAX_READ = 16 << 20
CHUNK = 1 << 20
SHOWN = 200  # the most of a name from a bundle an error shows: an entry's name can be a megabyte
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # never in a name the harness writes; a NUL in a path fails open() itself


def shown(name: str) -> str:
    """`name` as an error shows it: its repr() (a control character escaped, not sent to the terminal), cut after
    SHOWN characters with its length said."""
    text = repr(name)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(name)} characters)"


def _entry_name(member: tarfile.TarInfo, where: str) -> str | None:
    """The path under TOP of a tar entry that may be written (None for a folder, made as files need it);
    HarnessError naming the entry for anything that could write elsewhere or is not a plain file."""
    name, entry = member.name, f"{where}: entry {shown(member.name)}"
    if name.startswith("/") or PurePosixPath(name).is_absolute() or "\\" in name or re.match(r"[A-Za-z]:", name):
        raise HarnessError(f"{entry}: an absolute path; refused (nothing was extracted)")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise HarnessError(f"{entry}: '..', '.' or an empty part in its path; refused (nothing was extracted)")
    if parts[0] != TOP or (len(parts) == 1 and not member.isdir()):
        raise HarnessError(f"{entry}: outside the bundle's folder {TOP}/; refused (nothing was extracted)")
    if CONTROL.search(name):
        raise HarnessError(f"{entry}: a control character in its name; refused (nothing was extracted)")
    if member.issym() or member.islnk():
        raise HarnessError(f"{entry}: a link (to {shown(member.linkname)}); a bundle holds plain files only: refused "
                           "(nothing was extracted)")
    if member.isdir():
        return None
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse is not None:
        what = ("a sparse file" if member.sparse is not None else "a device or fifo" if member.isdev()
                else f"an entry of tar type {member.type!r}")
        raise HarnessError(f"{entry}: {what}; a bundle holds plain files only: refused (nothing was extracted)")
    if any(p.startswith(".") for p in parts[1:]):
        raise HarnessError(f"{entry}: a hidden file, which a bundle never holds (the harness keeps its own records in "
                           "them); refused (nothing was extracted)")
    return "/".join(parts[1:])


class _Bounded:
    """The decompressed tar as tarfile reads it, bounded as it arrives: within MAX_READ a read and MAX_BYTES (and
    the headers of MAX_MEMBERS entries) in all, so a header claiming gigabytes is refused before it is read into
    memory, and within MAX_RATIO decompressed bytes a compressed one (`raw`, the file gzip reads) past RATIO_FLOOR.
    `entry` says what is being read, for the error."""

    def __init__(self, f: gzip.GzipFile, raw: IO[bytes], where: str):
        self.f, self.raw, self.where = f, raw, where
        self.entry = "the first tar header"

    def _refuse(self, why: str) -> HarnessError:
        return HarnessError(f"{self.where}: {self.entry}: {why}; not a bundle (nothing was extracted)")

    def _check_ratio(self) -> None:
        out, read = self.f.tell(), self.raw.tell()
        if out > RATIO_FLOOR and out > MAX_RATIO * read:
            raise self._refuse(f"{out} bytes decompressed from {read}, more than {MAX_RATIO} to 1 (the cap on a "
                               f"bundle's compression ratio past its first {RATIO_FLOOR >> 20} MiB): a decompression "
                               "bomb")

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > MAX_READ or self.f.tell() + n > MAX_BYTES + MAX_MEMBERS * 4096:
            raise self._refuse(f"a tar header or entry past the bounds of a bundle ({n} bytes at offset "
                               f"{self.f.tell()})")
        data = self.f.read(n)
        self._check_ratio()
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        # tarfile seeks over an entry's padding; gzip decompresses what a seek skips, so a far one would pass the
        # bounds of read() unchecked
        if whence != 0 or offset > self.f.tell() + MAX_READ:
            raise self._refuse(f"a seek past the bounds of a bundle (to offset {offset} from {self.f.tell()})")
        at = self.f.seek(offset)
        self._check_ratio()
        return at

    def tell(self) -> int:
        return self.f.tell()


def _copy_out(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, budget: int) -> str:
    """Write one entry's bytes to `target` (a new file), at most `budget` of them; its sha256."""
    src = tar.extractfile(member)
    if src is None:
        raise HarnessError(f"entry {shown(member.name)}: cannot be read")
    h, written = hashlib.sha256(), 0
    with src, open(target, "xb") as dst:
        while chunk := src.read(CHUNK):
            written += len(chunk)
            if written > budget:
                raise HarnessError(f"entry {shown(member.name)}: more than its size or the bytes left to a bundle; "
                                   "not a bundle (nothing was extracted)")
            h.update(chunk)
            dst.write(chunk)
    return h.hexdigest()


def _check_size(member: tarfile.TarInfo, total: int, where: str) -> None:
    """Refuse an entry whose size (from its header, before any of its bytes is read) is past a cap."""
    if not 0 <= member.size <= MAX_ENTRY_BYTES:
        raise HarnessError(f"{where}: entry {shown(member.name)}: {member.size} bytes, past the cap on one file of a "
                           f"bundle ({MAX_ENTRY_BYTES} bytes); not a bundle (nothing was extracted)")
    if total + member.size > MAX_BYTES:
        raise HarnessError(f"{where}: entry {shown(member.name)}: more than {MAX_BYTES} bytes of files in all (the "
                           "cap on a bundle's files together); not a bundle (nothing was extracted)")


def _extract(path: Path, dest: Path) -> dict[str, str]:
    """Every file of the bundle at `path` written under `dest` (a new folder); {path under TOP: sha256}."""
    digests: dict[str, str] = {}
    total = 0
    try:
        # The compressed file opened here, not by gzip: its position is the compressed bytes read, for the ratio.
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            bounded = _Bounded(gz, raw, str(path))
            with tarfile.open(fileobj=cast(IO[bytes], bounded), mode="r:") as tar:
                for count, member in enumerate(tar, 1):
                    if count > MAX_MEMBERS:
                        raise HarnessError(f"{path}: more than {MAX_MEMBERS} entries; not a bundle (nothing was "
                                           "extracted)")
                    name = _entry_name(member, str(path))
                    if name is None:
                        continue
                    if name in digests:
                        raise HarnessError(f"{path}: entry {shown(member.name)} appears twice; refused (nothing was "
                                           "extracted)")
                    _check_size(member, total, str(path))
                    bounded.entry = f"entry {shown(member.name)}"
                    digests[name] = _write_entry(tar, member, dest.joinpath(*name.split("/")), total, str(path))
                    total += member.size
                    bounded.entry = f"the tar header after entry {shown(member.name)}"
    # ValueError: tarfile's own, from a pax header's numbers it cannot read (GNU.sparse.map)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, ValueError) as e:
        raise HarnessError(f"{path}: not a whole gzip tar ({shown(str(e)) if str(e) else type(e).__name__}): damaged "
                           "or truncated; nothing was extracted") from None
    return digests


def _write_entry(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, total: int, where: str) -> str:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return _copy_out(tar, member, target, min(member.size, MAX_BYTES - total))
    except OSError as e:  # a file where a folder should be, a name too long, or a full disk
        if isinstance(e, gzip.BadGzipFile):  # an OSError, but of the bundle's bytes: _extract's
            raise
        raise HarnessError(f"{where}: entry {shown(member.name)} could not be written ({e.strerror or e}); nothing "
                           "was extracted") from None


def _check_listing(path: Path, dest: Path, digests: dict[str, str]) -> dict:
    """bundle.json, after checking that the bundle holds exactly the files it lists, each with its sha256."""
    where = f"{path}: {TOP}/{RECORD}"
    if RECORD not in digests:
        raise HarnessError(f"{where} is missing: not a remax-bench bundle, or a truncated one; nothing was extracted")
    if (dest / RECORD).stat().st_size > MAX_DOCUMENT_BYTES:
        raise HarnessError(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes; not a bundle record")
    record = check_shape(parse_document((dest / RECORD).read_bytes(), where, yaml_syntax=False), BUNDLE_SHAPE,
                         where, ("format", "files", "runs"), "bundle record")
    if record["format"] != FORMAT:
        raise HarnessError(f"{where}: format {record['format']}; this remax-bench reads format {FORMAT}")
    listed, held = record["files"], {k: v for k, v in digests.items() if k != RECORD}
    missing = sorted(set(listed) - set(held))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise HarnessError(f"{path}: {shown(f'{TOP}/{missing[0]}')}{more}: listed in {RECORD} but not in the bundle: "
                           "truncated or cut down; nothing was extracted")
    unlisted = sorted(set(held) - set(listed))
    if unlisted:
        raise HarnessError(f"{path}: {shown(f'{TOP}/{unlisted[0]}')}: in the bundle but not listed in {RECORD}: added "
                           "after it was made; nothing was extracted")
    for name in sorted(listed):
        if held[name] != listed[name]:
            raise HarnessError(f"{path}: {shown(f'{TOP}/{name}')}: sha256 {held[name]}, but {RECORD} records "
                               f"{shown(listed[name])}: changed after the bundle was made; nothing was extracted")
    return record


def open_bundle(path: str | Path, into: str | Path) -> Path:
    """Extract the bundle at `path` into the folder `into`, laid out like a results directory; `into`. The folder
    appears only when every entry was a plain file inside the bundle's folder, within the caps above, and every file
    matched bundle.json; otherwise HarnessError naming the entry, and nothing is written (`into`, if it was there, is
    as it was). An existing `into` is replaced only when it is empty or an opened bundle itself
    (harness.io.check_replaceable)."""
    path, into = Path(path), Path(into)
    if not path.is_file():
        raise HarnessError(f"{path}: no bundle there (a .tar.gz made by `remax-bench bundle`)")
    with atomic_path(into, OWNER) as tmp:
        tmp.mkdir()
        _check_listing(path, tmp, _extract(path, tmp))
    return into


def describe(into: str | Path) -> dict:
    """The record of an opened bundle (bundle.json), read back bounded."""
    return read_json_object(Path(into) / RECORD, "bundle record")
