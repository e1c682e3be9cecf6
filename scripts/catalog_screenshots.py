"""The screenshots of `raysweep site` in docs/catalog.md: a small catalogue of stub campaigns (the test's:
tests/catalog_stubs.py), its site, and the first screen of its index, an overlay of two campaigns, its
history page and one configuration's history page, taken by headless Chromium.

    .venv/bin/python scripts/catalog_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = parser.parse_args(argv)
    from catalog_stubs import make_campaign
    from readme_sample import screenshot

    from raysweep.catalog.site import write_site
    from raysweep.catalog.store import Catalog

    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="rs-site-") as tmp:
        root = Path(tmp)
        make_campaign(root / "team/old", "nightly-old", started_at=1.70e9, vllm="0.31.0", seed=1,
                      input_lens=(16, 32), concurrencies=(1, 2, 4, 8))
        make_campaign(root / "team/new", "nightly-new", started_at=1.71e9, vllm="0.32.0", scale=0.8, seed=2,
                      input_lens=(16, 32), concurrencies=(1, 2, 4, 8))
        make_campaign(root / "other/long", "long-prompts", started_at=1.72e9, input_lens=(64,), seed=4)
        cat = Catalog(root / "catalog", create=True)
        cat.add([root / "team", root / "other"])
        site = write_site(cat, root / "site")
        ids = {c["name"]: cid for cid, c in cat.campaigns.items()}
        shots = [("catalog-index.png", "index.html", ""),
                 ("catalog-overlay.png", "overlay.html", f"?ids={ids['nightly-old']},{ids['nightly-new']}"),
                 ("catalog-history.png", "history.html", ""),
                 ("catalog-history-config.png", "history-0.html", "")]
        for png, page, query in shots:
            screenshot(site / page, out / png, query, wait_ms=5000)
            print(out / png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
