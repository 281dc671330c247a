#!/usr/bin/env python3
"""Copies a calibration database, keeping its sessions 1..LAST (all without LAST).

    scripts/cut_calibration.py IN.db[.xz] OUT.db [LAST]

The committed calibration (results/h200/calibration_<commit>.db.xz) is cumulative: an earlier
file's sessions are the first sessions of a later one, so a script or a test that started from
an earlier file takes the committed one cut to that file's last session. OUT.db is written
whole or not at all (a temporary file beside it, renamed at the end); an existing OUT.db is
replaced.
"""
import lzma
import os
import shutil
import sqlite3
import sys


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit("usage: scripts/cut_calibration.py IN.db[.xz] OUT.db [LAST]")
    src, dst = argv[1], argv[2]
    last = None
    if len(argv) == 4:
        try:
            last = int(argv[3])
        except ValueError:
            sys.exit(f"cut_calibration: LAST = {argv[3]!r} is not a session id")
    tmp = dst + ".part"
    opener = lzma.open if src.endswith(".xz") else open
    try:
        with opener(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        db = sqlite3.connect(tmp)
        try:
            ids = [r[0] for r in db.execute("SELECT id FROM calibration_session ORDER BY id")]
            if last is not None:
                if last not in ids:
                    span = f"{ids[0]}..{ids[-1]}" if ids else "none"
                    raise ValueError(f"no session {last} (sessions {span})")
                db.execute("DELETE FROM calibration_sample WHERE session_id > ?", (last,))
                db.execute("DELETE FROM calibration_session WHERE id > ?", (last,))
                db.commit()
                db.execute("VACUUM")
        finally:
            db.close()
        os.replace(tmp, dst)
    except (OSError, lzma.LZMAError, sqlite3.DatabaseError, ValueError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        sys.exit(f"cut_calibration: {src}: {e}")


if __name__ == "__main__":
    main(sys.argv)
