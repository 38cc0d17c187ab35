"""The per-host processor: wire protocol, client, windowing, and the daemon that writes the store."""

from argus.processor.client import Interner, ProcessorClient
from argus.processor.daemon import Processor, ProcessorConfig, default_socket_path
from argus.processor.protocol import DTYPES, Msg
from argus.processor.window import WindowData, WindowStats, WindowWriter

__all__ = ["DTYPES", "Interner", "Msg", "Processor", "ProcessorClient", "ProcessorConfig", "WindowData",
           "WindowStats", "WindowWriter", "default_socket_path"]
