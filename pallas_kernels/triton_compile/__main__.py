"""``python -m pallas_kernels.triton_compile``: see the package docstring."""

import sys

from pallas_kernels.triton_compile.report import main

sys.exit(main())
