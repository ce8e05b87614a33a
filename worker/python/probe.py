"""The probe a new zygote generation runs in one of its own sandboxed workers before the
pool switches to it: every module named on stdin (a JSON list) must import. An import
that fails ends the job with its traceback, which the rollover reports as its error."""

import json
import sys


def main():
    modules = json.loads(sys.stdin.read() or "[]")
    for name in modules:
        __import__(name)
    print(json.dumps({"python": sys.version.split()[0], "imported": modules}))


main()
