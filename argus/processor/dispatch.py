"""The daemon's side of the protocol: one complete frame of a client to its handler.

``HELLO`` admits the rank (``admission.py``); after it, ``NAMES`` extend the rank's name table,
record batches and ``DROPS`` go into its windows (``intake.py``), a ``FLUSH`` closes them now
and is answered once they are written (``handoff.py``), ``BYE`` closes the connection. Anything
else, or anything before ``HELLO``, raises: ``Connections`` drops that client only.
"""

from __future__ import annotations

from typing import Callable

from argus.errors import ProtocolError
from argus.processor.admission import Admission
from argus.processor.connection import Connection, parse_names
from argus.processor.handoff import Handoff
from argus.processor.intake import Intake
from argus.wire import TABLES_BY_MSG, Msg, decode_array, decode_json

__all__ = ["Dispatch"]


class Dispatch:
    def __init__(self, admission: Admission, intake: Intake, handoff: Handoff, close: Callable[[Connection], None]):
        self._admission = admission
        self._intake = intake
        self._handoff = handoff
        self._close = close  # BYE: the connection closes (its rank leaves)

    def __call__(self, conn: Connection, msg: Msg, payload: bytes) -> None:
        if msg == Msg.HELLO:
            self._admission.hello(conn, payload)
            return
        if conn.info is None:
            raise ProtocolError(f"{msg.name} before HELLO")
        if msg == Msg.NAMES:
            conn.add_names(parse_names(decode_json(payload), len(conn.id_map)))
        elif msg in TABLES_BY_MSG:
            self._intake.records(conn, msg, decode_array(msg, payload))
        elif msg == Msg.DROPS:
            self._intake.drops(conn, decode_array(msg, payload))
        elif msg == Msg.FLUSH:
            self._handoff.flush(conn, flush_seq(decode_json(payload)))
        elif msg == Msg.BYE:
            self._close(conn)
        else:
            raise ProtocolError(f"unexpected {msg.name} from a client")


def flush_seq(doc: object) -> int:
    """The sequence number of a ``FLUSH`` document ``{"seq": n}``, a non-negative 64-bit integer."""
    seq = doc.get("seq") if isinstance(doc, dict) else None
    if type(seq) is not int or not 0 <= seq < 1 << 63:
        raise ProtocolError(f"FLUSH seq must be a non-negative 64-bit integer, not {seq!r:.40}")
    return seq
