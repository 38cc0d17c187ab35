"""The wire between ranks and their host's processor: a contract owned by neither end.

* ``protocol`` — framed, versioned socket messages (``HELLO``, packed record batches, ACKs,
  CONTROL) and the packed record dtypes shared by every path into the processor;
* ``frames`` — the frame reader both ends use on a byte stream;
* ``client`` — a rank's (or a test's, or a bench's) connection to the processor;
* ``ring`` and ``inflight`` — a rank's shared-memory ring: records that survive the rank's
  death, and its in-flight state, readable while it is stuck;
* ``paths`` — the one default for the socket and the ring directory.

Light by design: a training process imports it (numpy only).
"""

from argus.wire.client import Interner, ProcessorClient
from argus.wire.frames import FrameReader
from argus.wire.inflight import GroupState, InflightReader, InflightState, InflightWriter, group_key
from argus.wire.paths import check_private_dir, default_socket_path, ring_dir, runtime_dir
from argus.wire.protocol import (CATEGORIES, DROP_TABLES, DTYPES, GPU_STEP_PHASE, GROUP_KINDS, HEADER, KINDS, MAX_PAYLOAD,
                                 RERUNS, SENSORS, TABLES_BY_MSG, VERSION, Msg, decode_array, decode_header, decode_json, encode_array,
                                 encode_frame, encode_json)
from argus.wire.ring import RING_TABLES, RingReader, RingWriter, ring_bytes

__all__ = ["CATEGORIES", "DROP_TABLES", "DTYPES", "GPU_STEP_PHASE", "GROUP_KINDS", "HEADER", "KINDS", "MAX_PAYLOAD", "RERUNS", "SENSORS", "TABLES_BY_MSG",
           "VERSION", "FrameReader", "GroupState", "InflightReader", "InflightState", "InflightWriter", "Interner",
           "Msg", "ProcessorClient", "RING_TABLES", "RingReader", "RingWriter", "check_private_dir",
           "decode_array", "decode_header", "decode_json", "default_socket_path", "encode_array", "encode_frame",
           "encode_json", "group_key", "ring_bytes", "ring_dir", "runtime_dir"]
