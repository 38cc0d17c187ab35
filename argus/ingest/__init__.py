"""The window pipeline: a closed window as one record (:class:`ClosedWindow`) and the
exporters it goes through — the store, the TSDB sinks, Perfetto evidence.

The processor's writer thread drives it; the offline importers and the simulator write
through the same store path (``argus.store.WindowWriter``, kernels compressed by
:func:`summarize`), so a store looks the same whichever way it was filled.
"""

from argus.ingest.exporters import EvidenceExporter, StoreExporter, TsdbExporter, WindowExporter, window_job
from argus.ingest.window import ClosedWindow, RankPlace, WrittenWindow, summarize, write_window

__all__ = ["ClosedWindow", "EvidenceExporter", "RankPlace", "StoreExporter", "TsdbExporter", "WindowExporter",
           "WrittenWindow", "summarize", "window_job", "write_window"]
