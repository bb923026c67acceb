"""``python -m bench``: the benchmark suite (bench/bench.py)."""

from bench.bench import main

raise SystemExit(main())
