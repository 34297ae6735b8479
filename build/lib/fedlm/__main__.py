import sys

from fedlm.cli import main

sys.exit(main())
