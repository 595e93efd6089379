#!/usr/bin/env python3
"""Counts the results in meson's JSON test logs of the given build folders and prints the closing
line "N passed, N failed, N skipped". A build folder without a log counts as one failure."""
import json
import os
import sys

passed = failed = skipped = 0
for build in sys.argv[1:]:
    path = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(path):
        failed += 1
        continue
    with open(path) as log:
        for line in log:
            result = json.loads(line)["result"]
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
