"""`python -m esfuse` and the `esfuse` command: the CLI, imported with the collector off.

Importing it brings in trio, elasticsearch, httpx and click: hundreds of thousands
of objects, none of them garbage and all of them living as long as the process.
With the collector on, it walked them again and again during the import (610 ms
instead of 568, medians of 25 runs). Merely turning it back on afterwards only
put that off: the first collection then walked every object the import had left
in the young generation, 40-60 ms before the mount even began, and a second one
in the daemon cost another 45 ms while it made its HTTP client. Frozen, the
collector never looks at them again (refcounting still frees what is dropped);
mount-ready fell by about 90 ms.
"""

import gc


def main() -> None:
    gc.disable()
    from esfuse.cli import main as cli

    gc.freeze()
    gc.enable()
    cli()


if __name__ == "__main__":
    main()
