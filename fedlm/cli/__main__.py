"""``python -m fedlm.cli``, as ``python -m fedlm`` and the ``fedlm`` script."""

import sys

from fedlm.cli import main

sys.exit(main())
