import sys

try:   # Ctrl-C while the lab's modules import is an interrupt, not a traceback
    from inference_lab.cli import main

    sys.exit(main())
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
