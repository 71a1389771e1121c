"""Settings for the benchmarks: the test settings (a private Redis on a free port) plus
a few destinations the loaded messages use."""

from tests.settings import *  # noqa: F403
from tests.settings import OUTBOX

DEBUG = False
BENCH_DESTINATIONS = ["orders", "invoices", "shipping", "crm", "analytics"]
OUTBOX = {
    **OUTBOX,
    "DESTINATIONS": {
        **OUTBOX["DESTINATIONS"],
        **{name: {"TRANSPORT": "locmem", "MAX_RETRIES": 5} for name in BENCH_DESTINATIONS},
    },
}
