"""Persistent compile cache: object code per (HLO, host CPU, versions), and
texts of earlier compile stages (the bridge's HLO per TensorFlow graph).

Entries are native code this process runs, so only the user's own files in
a directory only the user (and root) can change are trusted: the path is
judged as ssh's StrictModes does, then used through one descriptor so it
cannot be swapped; an unsafe directory is reported once and bypassed.
An entry `<key>.kjc` is plain data, never unpickled: a magic line (format,
header SHA-256), a JSON header, then blobs with their SHA-256; anything that
does not add up is ignored and rebuilt. KERASJIT_CACHE_DIR moves the cache;
empty turns it off.
"""
import functools
import hashlib
import json
import os
import pathlib
import secrets
import stat
import zlib
from collections.abc import Sequence

import llvmlite
import numpy as np

from ...errors import warn
from ...hlo.attributes import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS
from ...hlo.printer import format_attr, format_literal
from ...hlo.shape import DTYPES
from ...kernels.ir import Buffer, FusionDecision, KernelProgram
from ...passes.util import ANNOTATION_ATTRS

FORMAT = 5     # bump when what an entry holds changes
MAGIC = b"kerasjit-cache"
SUFFIX = ".kjc"
TEXT_SUFFIX = ".kjt"
MAX_ENTRY_BYTES = 1 << 30
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH

_refused = set()    # directories already warned about in this process


class Listings(Sequence):
    """A cluster's kernel listings, [(name, LLVM IR)], kept compressed until
    explain() reads them: ResNet50's are 54 MB of text, whose decoding was most
    of a warm start's load."""

    def __init__(self, compressed):
        self.compressed = compressed

    @classmethod
    def of(cls, listings):
        return cls(zlib.compress(json.dumps(listings).encode(), 1))

    @functools.cached_property
    def _items(self):
        return [tuple(k) for k in json.loads(zlib.decompress(self.compressed))]

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)

    def __eq__(self, other):
        return isinstance(other, Listings) and list(self) == list(other)


class BadEntry(Exception):
    """An entry that is not ours, not a regular file, or not self-consistent."""


def cache_dir():
    path = os.environ.get("KERASJIT_CACHE_DIR", os.path.join(
        os.path.expanduser("~"), ".cache", "kerasjit"))
    return path or None


def fingerprint(module):
    """What decides the module's code, names aside: its instructions and
    computations numbered by position, without metadata. TensorFlow numbers
    every trace anew, and a second copy of a model (layers `dense_1` where
    the first had `dense`) must find the first one's code."""
    index = {comp: i for i, comp in enumerate(module.computations)}
    number = {inst: f"{i}.{k}" for comp, i in index.items()
              for k, inst in enumerate(comp.instructions)}

    def attr(key, value):
        if key in COMPUTATION_ATTRS:
            return f"c{index[value]}"
        if key in COMPUTATION_LIST_ATTRS:
            return ",".join(f"c{index[c]}" for c in value)
        return format_attr(key, value)
    lines = [f"aliases {sorted(module.input_output_alias.items())}",
             f"entry c{index[module.entry]}"]
    for comp, i in index.items():
        lines.append(f"c{i} root {number[comp.root]}")
        for inst in comp.instructions:
            content = (format_literal(inst.literal, inst.shape.dtype) if inst.literal is not None
                       else inst.parameter_number)
            attrs = [f"{k}={attr(k, v)}" for k, v in inst.attrs.items()
                     if k not in ANNOTATION_ATTRS]
            lines.append(f"{number[inst]} {inst.shape.with_layout()} {inst.opcode} {content} "
                         f"{[number[op] for op in inst.operands]} {attrs}")
    return "\n".join(lines)


@functools.cache
def compiler_fingerprint():
    """A hash of kerasjit's own source: a changed compiler (even at the same
    version, e.g. an editable install) never reuses code an older one built."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(module, host, donate=None):
    """The key of `module`'s code (a module from the cache may know its
    fingerprint already: bridge._StoredModule)."""
    known = getattr(module, "fingerprint", None)
    text = (f"{FORMAT}\n{compiler_fingerprint()}\nllvmlite {llvmlite.__version__}\n"
            f"{host}\ndonated {sorted((donate or {}).items())}\n{known or fingerprint(module)}")
    return hashlib.sha256(text.encode()).hexdigest()


def load(key):
    """The cached record for `key`, or None (no cache, missing, bad or stale)."""
    directory = _open_directory()
    if directory is None:
        return None
    try:
        return _decode(_read_entry(directory, key + SUFFIX), key)
    except (OSError, BadEntry):
        return None
    finally:
        os.close(directory)


def store(key, record):
    _store(key + SUFFIX, _encode(key, record))


def load_text(key):
    """The text stored under `key` by store_text, or None."""
    directory = _open_directory()
    if directory is None:
        return None
    try:
        header, blobs = _unpack(_read_entry(directory, key + TEXT_SUFFIX), key)
        return bytes(blobs[0]).decode()
    except (OSError, BadEntry, IndexError, UnicodeDecodeError):
        return None
    finally:
        os.close(directory)


def store_text(key, text):
    """Keep `text` (what a compile stage made, e.g. the bridge's HLO) under `key`."""
    _store(key + TEXT_SUFFIX, _pack(key, {}, [text.encode()]))


def _store(name, chunks):
    directory = _open_directory()
    if directory is None:
        return
    try:
        _write_entry(directory, name, chunks)
    except OSError:
        pass    # a full disk, or a directory at the entry's path, costs the next compile
    finally:
        os.close(directory)


# ---------------------------------------------------------------- the directory
def _open_directory():
    """A descriptor of the cache directory (created 0700 if missing), or None:
    the cache is off, or the directory is unsafe or unusable (warned once)."""
    path, fd = cache_dir(), None
    if not path:
        return None
    try:
        created = _make_directory(path)
        real = os.path.realpath(path)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        reason = _why_unsafe(fd, real)
        if created and not reason:
            os.fchmod(fd, 0o700)    # a umask may have taken the owner's bits
    except OSError as error:
        reason = str(error)
    if reason:
        if fd is not None:
            os.close(fd)
        _refuse(path, reason)
        return None
    return fd


def _make_directory(path):
    """Whether the directory had to be created (0700; its parents as makedirs does)."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        return False
    return True


def _why_unsafe(fd, path):
    """Why another user could plant or replace entries in the directory open
    as `fd` (at real path `path`), or None."""
    uid = os.geteuid()
    info = os.fstat(fd)
    if info.st_uid != uid:
        return f"it is owned by uid {info.st_uid}, not by you (uid {uid})"
    if info.st_mode & SHARED_WRITE:
        return f"it is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    for parent in pathlib.Path(path).parents:
        info = os.stat(parent)
        if info.st_uid not in (0, uid):
            return f"{parent} above it is owned by uid {info.st_uid}, neither root nor you"
        if info.st_mode & SHARED_WRITE and not info.st_mode & stat.S_ISVTX:
            return f"{parent} above it is writable by group or others and not sticky"
    return None


def _refuse(path, reason):
    if path in _refused:
        return
    _refused.add(path)
    warn(f"kerasjit: not using the compile cache {path}: {reason}. Its entries are native "
         "code this process runs, so it must be a directory owned by you that only you can "
         "write, below directories only you or root can write: fix the owner or mode (chmod "
         "700), or set KERASJIT_CACHE_DIR to another directory (empty turns the cache off).")


# ---------------------------------------------------------------- entries as files
def _read_entry(directory, name):
    """The bytes of entry `name`, if a regular file of ours that no one else can
    write. Never follows a symbolic link, never blocks on a FIFO."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=directory)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                and not info.st_mode & SHARED_WRITE and info.st_size <= MAX_ENTRY_BYTES):
            raise BadEntry(name)
        with open(fd, "rb", closefd=False) as f:
            return f.read(info.st_size + 1)
    finally:
        os.close(fd)


def _write_entry(directory, name, chunks):
    """Replace entry `name` at once: a reader sees the old entry or the new one."""
    temp = f"{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                 dir_fd=directory)
    replaced = False
    try:
        with open(fd, "wb") as f:
            f.writelines(chunks)
        os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
        replaced = True
    finally:
        if not replaced:
            os.unlink(temp, dir_fd=directory)


# ---------------------------------------------------------------- the format
def _magic_line(header):
    return b"%s %d %s\n" % (MAGIC, FORMAT, hashlib.sha256(header).hexdigest().encode())


def _encode(key, record):
    """The chunks of an entry holding `record`: magic line, JSON header, blobs."""
    blobs = [*record["objects"], record["kernels"].compressed]
    program = record["program"]     # its steps are [] (they are in the code)

    def constant(buffer):
        if buffer.data is None:
            return None
        array = np.asarray(buffer.data, DTYPES[buffer.dtype], order="C")
        blobs.append(array.tobytes())
        return {"blob": len(blobs) - 1, "shape": array.shape}

    header = {
        "objects": list(range(len(record["objects"]))), "entry": record["entry"],
        "kernels": len(record["objects"]), "cores_free": record["cores_free"],
        "counters": record["counters"],
        "program": {
            "buffers": [{"id": b.id, "dtype": b.dtype, "dims": b.dims, "role": b.role,
                         "data": constant(b), "name": b.name} for b in program.buffers],
            "params": program.params, "outputs": program.outputs,
            "decisions": program.decisions, "storage": list(program.storage.items()),
            "slot_bytes": program.slot_bytes, "aliases": list(program.aliases.items())}}
    return _pack(key, header, blobs)


def _pack(key, header, blobs):
    """The chunks of an entry: magic line, JSON header (with the key and the
    blobs' sizes and digests), the blobs."""
    header = dict(header, key=key, blobs=[[len(b), hashlib.sha256(b).hexdigest()] for b in blobs])
    text = json.dumps(header).encode()
    return [_magic_line(text), text, b"\n", *blobs]


def _unpack(data, key):
    """(header, blobs) of entry bytes `data` for `key`; BadEntry if anything is off."""
    magic_end = data.find(b"\n") + 1
    header_end = data.find(b"\n", magic_end)
    header = data[magic_end:header_end]
    if header_end < 0 or data[:magic_end] != _magic_line(header):
        raise BadEntry("not this format, or a damaged header")
    header = json.loads(header)
    if header["key"] != key:
        raise BadEntry("another key's entry")
    return header, _blobs(memoryview(data)[header_end + 1:], header["blobs"])


def _decode(data, key):
    """The record entry bytes `data` hold for `key`; BadEntry if anything is off."""
    header, blobs = _unpack(data, key)
    plain = header["program"]

    def constant(buffer):
        if buffer["data"] is None:
            return None
        blob, shape = buffer["data"]["blob"], buffer["data"]["shape"]
        return np.frombuffer(blobs[blob], DTYPES[buffer["dtype"]]).reshape(shape).copy()

    buffers = [Buffer(b["id"], b["dtype"], tuple(b["dims"]), b["role"], constant(b), b["name"])
               for b in plain["buffers"]]
    program = KernelProgram(buffers, [], plain["params"], plain["outputs"],
                            [FusionDecision(*d) for d in plain["decisions"]], dict(plain["storage"]),
                            plain["slot_bytes"], dict(plain["aliases"]))
    return {"program": program, "objects": [bytes(blobs[i]) for i in header["objects"]],
            "entry": header["entry"], "kernels": Listings(bytes(blobs[header["kernels"]])),
            "cores_free": header["cores_free"],
            "counters": header["counters"] and tuple(header["counters"])}


def _blobs(data, sizes_and_digests):
    """`data` cut into the blobs the header lists, each checked against its digest."""
    blobs, offset = [], 0
    for size, digest in sizes_and_digests:
        blob = data[offset:offset + size]
        if len(blob) != size or hashlib.sha256(blob).hexdigest() != digest:
            raise BadEntry("a truncated or damaged blob")
        blobs.append(blob)
        offset += size
    if offset != len(data):
        raise BadEntry("bytes after the last blob")
    return blobs
