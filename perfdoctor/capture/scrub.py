"""Secrets out of everything capture writes: command lines, log lines, and the SQLite exports.

One rule decides what is secret: :func:`perfdoctor.tuning_env.is_secret` on a *name* (environment
variable or option: KEY, TOKEN, SECRET, PASS, AUTH, CREDENTIAL). On top of it, three shapes of text
carry a value worth hiding:

* ``NAME=value`` / ``NAME="value"`` / ``--name=value`` with a secret name (environment blocks, nsys's
  ``META_DATA_CAPTURE`` rows ``PROCESS_<n>:ENVIRONMENT_VARIABLE`` = ``NAME="value"``, command lines);
* ``--name value`` with a secret option name (command lines);
* user-info in a URL, ``scheme://user:password@host`` (tokens travel as the user part too).

nsys exports keep the profiled process's environment and command line as strings: in 2022.4 one
``StringIds`` row per process holds the whole environment block, NUL-separated; from 2023.4 on,
``META_DATA_CAPTURE`` holds one row per variable and ``PROCESS_<n>:COMMAND``
(research/nsys_schema.md). Rather than chase table names across releases, every text value of every
table is passed through the same redaction; values known to be secret (taken from the capture's own
environment and command) are also replaced wherever they occur, blobs included. The result is written
with ``VACUUM INTO``, a fresh file without the free pages that would still hold the old strings.

PyTorch profiler (Kineto) traces written by the hook under ``--profiler torch`` get the same redaction
on every JSON string, keys included (:func:`scrub_kineto`): Kineto records the process name, thread
names, op and ``record_function`` names and, depending on options, argument values; none of them is
expected to hold a secret, but none is trusted not to.

Standard library only: this runs on GPU nodes (DESIGN §1).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from perfdoctor.tuning_env import REDACTED, SECRET_MARKERS, is_secret

MIN_LITERAL = 6  # shorter known secrets are only hidden by their context: "1" must not vanish from every string
_NAME = r"[A-Za-z_][\w.-]*"
_PAIR = re.compile(rf"(?<![\w.-])(?P<name>-{{0,2}}{_NAME})=(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"']*)")
_OPTION_VALUE = re.compile(rf"(?<![\w.-])(?P<name>--?{_NAME})(?P<sep>\s+)(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"'-]\S*)")
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][\w+.-]*://)(?P<userinfo>[^/\s@\"']+)@")
_WHOLE_ASSIGNMENT = re.compile(rf"(?P<name>{_NAME})=(?P<value>.*)", re.DOTALL)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with secret values replaced by ``<redacted>`` (see the module docstring)."""
    if "\0" in text:  # an environment block: NAME=value entries, values may hold spaces
        return "\0".join(redact_text(part, secrets) for part in text.split("\0"))
    whole = _WHOLE_ASSIGNMENT.fullmatch(text)
    if whole and is_secret(whole["name"]):
        value = whole["value"]
        quote = value[0] if len(value) > 1 and value[0] in "'\"" and value[-1] == value[0] else ""
        return f"{whole['name']}={quote}{REDACTED}{quote}"
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _PAIR.sub(_hide_pair, text)
    text = _OPTION_VALUE.sub(_hide_option_value, text)
    for value in sorted(secrets, key=len, reverse=True):
        if len(value) >= MIN_LITERAL and value in text:
            text = text.replace(value, REDACTED)
    return text


def _hide_pair(match: re.Match[str]) -> str:
    if not is_secret(match["name"].lstrip("-")) or match["value"] in ("", REDACTED):
        return match[0]
    quote = match["value"][0] if match["value"][:1] in ("'", '"') else ""
    return f"{match['name']}={quote}{REDACTED}{quote}"


def _hide_option_value(match: re.Match[str]) -> str:
    if not is_secret(match["name"].lstrip("-")) or match["value"] == REDACTED:
        return match[0]
    return f"{match['name']}{match['sep']}{REDACTED}"


def redact_command(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """``--api-key abc`` / ``--api-key=abc`` / ``WANDB_API_KEY=abc`` / ``https://u:p@h`` → ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
        else:
            out.append(redact_text(arg, secrets))
        hide_next = arg.startswith("-") and "=" not in arg and is_secret(arg.lstrip("-"))
    return out


def secret_values(env: Mapping[str, str], argv: Sequence[str]) -> set[str]:
    """The values :func:`redact_text` would hide in this environment and command line: what must not
    appear anywhere, in whatever form a file holds it."""
    found = {value for name, value in env.items() if is_secret(name) and value}
    for arg, hidden in zip(argv, redact_command(argv)):
        if hidden == REDACTED:
            found.add(arg)
        elif hidden != arg:
            found.update(_removed(arg, hidden))
    return {value for value in found if value.strip('"\'')}


def _removed(original: str, redacted: str) -> list[str]:
    """The pieces of ``original`` that ``<redacted>`` stands for in ``redacted``."""
    pieces = [re.escape(p) for p in redacted.split(REDACTED)]
    match = re.fullmatch("(.*?)".join(pieces), original, re.DOTALL)
    return [v.strip('"\'') for v in match.groups()] if match else []


def scrub_sqlite(source: Path, target: Path, secrets: Iterable[str] = ()) -> int:
    """Redact every text value of ``source`` (changed in place: a private, disposable copy) and write
    the result to ``target`` as a fresh file. Returns the number of values changed."""
    literals = sorted({s for s in secrets if len(s) >= MIN_LITERAL}, key=len, reverse=True)
    db = sqlite3.connect(source, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=OFF")  # the source is thrown away: no journal of secret pages
        db.create_function("pd_redact", 1, lambda v: _redacted_or_none(v, literals), deterministic=True)
        db.create_function("pd_is_secret", 1, lambda v: isinstance(v, str) and is_secret(v), deterministic=True)
        changed = 0
        db.execute("BEGIN")
        for table, columns in _text_columns(db):
            quoted = _quote(table)
            for column in columns:
                col = _quote(column)
                changed += db.execute(f"UPDATE {quoted} SET {col} = pd_redact({col}) WHERE typeof({col}) = 'text' "
                                      f"AND ({_candidates(col, literals)}) AND pd_redact({col}) IS NOT NULL",
                                      literals).rowcount
            if {"name", "value"} <= set(columns):  # name/value tables: a secret name hides its value
                changed += db.execute(f"UPDATE {quoted} SET value = ? WHERE pd_is_secret(name) AND value IS NOT ?",
                                      (REDACTED, REDACTED)).rowcount
            changed += _scrub_blobs(db, table, literals)
        db.execute("COMMIT")
        partial = target.with_name(f".{target.name}.partial")
        partial.unlink(missing_ok=True)
        try:
            db.execute("VACUUM INTO ?", (str(partial),))
        except sqlite3.Error:
            partial.unlink(missing_ok=True)  # a full disk: no half file
            raise
    finally:
        db.close()
    os.replace(partial, target)
    return changed


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def scrub_kineto(source: Path, target: Path, secrets: Iterable[str] = ()) -> int:
    """Redact every JSON string of a (gzipped or plain) Kineto trace into ``target`` (gzipped), written
    under a hidden name and renamed, so ``target`` never holds a secret. Returns the strings changed.

    Works on the JSON text, string by string, and leaves every other byte as it is: Kineto's output is
    not always strict JSON (it writes some metadata unescaped), which a decode and re-encode would refuse
    or rewrite. One scan finds what could be a secret (a marker word, a URL, a known value); only the
    lines holding such a hit are split into strings (a JSON string never holds a raw newline, so a line
    starts outside any string), and only the strings holding one are decoded. Memory: the decompressed
    file, about twice."""
    literals = sorted({s for s in secrets if len(s) >= MIN_LITERAL}, key=len, reverse=True)
    with open(source, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    with (gzip.open(source, "rb") if gz else open(source, "rb")) as fh:
        data = fh.read()
    needles = [v.encode() for v in literals]
    maybe = re.compile(b"|".join([*(m.lower().encode() for m in SECRET_MARKERS), b"://",
                                  *(re.escape(v) for v in needles)]), re.IGNORECASE)
    changed = 0

    def redact(match: re.Match[bytes]) -> bytes:
        nonlocal changed
        literal = match[0]
        if maybe.search(literal) is None:
            return literal
        try:
            text = json.loads(literal)
        except ValueError:  # Kineto's unescaped text: redact it as it stands
            inner = literal[1:-1].decode("utf-8", "replace")
            new = redact_text(inner, literals)
            if new == inner:
                return literal
            changed += 1
            return b'"' + new.replace('"', "'").encode() + b'"'
        new = redact_text(text, literals)
        if new == text:
            return literal
        changed += 1
        return json.dumps(new, ensure_ascii=False).encode()

    pieces, done = [], 0
    for at in _hits(data, needles):
        if at < done:  # on a line already redacted
            continue
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        pieces += [data[done:start], _JSON_STRING.sub(redact, data[start:end])]
        done = end
    if pieces:
        data = b"".join([*pieces, data[done:]])
    partial = target.with_name(f".{target.name}.partial")
    try:
        with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as out:
            out.write(data)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    return changed


def _hits(data: bytes, needles: list[bytes]) -> list[int]:
    """Sorted positions of every secret marker (any case), ``://`` and known secret value in ``data``:
    ``bytes.find`` loops, which scan at memory speed where one case-insensitive regex crawls."""
    lowered = data.lower()
    found = []
    for haystack, words in ((lowered, [*(m.lower().encode() for m in SECRET_MARKERS), b"://"]), (data, needles)):
        for word in words:
            at = haystack.find(word)
            while at >= 0:
                found.append(at)
                at = haystack.find(word, at + 1)
    return sorted(found)


def _candidates(col: str, literals: list[str]) -> str:
    """SQL that is true for every value :func:`redact_text` could change (a secret marker, a URL with
    user-info, a known secret), so that the Python redaction runs on few rows. LIKE stops at a NUL
    byte and instr() does not: values with NULs (environment blocks) always go to Python."""
    markers = " OR ".join(f"{col} LIKE '%{m.lower()}%'" for m in SECRET_MARKERS)
    known = "".join(f" OR instr({col}, ?) > 0" for _ in literals)
    return f"instr({col}, char(0)) > 0 OR (instr({col}, '://') > 0 AND instr({col}, '@') > 0) OR {markers}{known}"


def _redacted_or_none(value: object, literals: list[str]) -> str | None:
    if not isinstance(value, str):
        return None
    new = redact_text(value, literals)
    return new if new != value else None


def _text_columns(db: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """Tables and their columns that may hold text (declared TEXT, or no type: SQLite stores anything)."""
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                       "AND name NOT LIKE 'sqlite_%'")]
    out = []
    for table in tables:
        columns = [(r[1], (r[2] or "").upper()) for r in db.execute(f"PRAGMA table_info({_quote(table)})")]
        text = [name for name, kind in columns if kind in ("", "TEXT") or "CHAR" in kind or "CLOB" in kind]
        blob = any(kind == "BLOB" for _, kind in columns)
        if text or blob:
            out.append((table, text))
    return out


def _scrub_blobs(db: sqlite3.Connection, table: str, literals: list[str]) -> int:
    """Known secret values inside BLOB columns (NVTX payloads, 2026.x) become asterisks of the same
    length, so that binary layouts keep their sizes."""
    if not literals:
        return 0
    quoted = _quote(table)
    columns = [r[1] for r in db.execute(f"PRAGMA table_info({quoted})") if (r[2] or "").upper() == "BLOB"]
    changed = 0
    for column in columns:
        col = _quote(column)
        for value in literals:
            needle = value.encode()
            changed += db.execute(f"UPDATE {quoted} SET {col} = CAST(replace({col}, ?, ?) AS BLOB) "
                                  f"WHERE typeof({col}) = 'blob' AND instr({col}, ?) > 0",
                                  (needle, b"*" * len(needle), needle)).rowcount
    return changed


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
