"""The runner both client-check scripts use: `@check` registers a check, `run` runs every one,
prints one line each and a total, and exits non-zero if any failed, naming it."""
import sys

_CHECKS = []


def check(fn):
    _CHECKS.append(fn)
    return fn


def run_checks(client_label):
    failed = 0
    for fn in _CHECKS:
        try:
            fn()
            print(f"ok    {fn.__name__}")
        except Exception as e:  # noqa: BLE001 - report every check
            failed += 1
            print(f"FAIL  {fn.__name__}: {type(e).__name__}: {e}")
    print(f"{len(_CHECKS) - failed}/{len(_CHECKS)} passed ({client_label})")
    sys.exit(1 if failed else 0)
