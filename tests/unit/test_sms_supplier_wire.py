"""The simulated supplier answers a kept-alive request in one write, with Nagle off (counted, not timed).

An answer written as two sends (headers, then body) on a Nagle socket holds the
body until the client's delayed ACK of the headers (~40 ms on Linux's loopback):
that tripled the simulated 20 ms request and bounded ``smsload --mode single``.
"""

from __future__ import annotations

import json
import socket
import threading

from tools.sms_supplier import Supplier, _Handler


class _CountingSocket(socket.socket):
    """A socket that counts the writes made on it (``send``/``sendall``)."""

    writes = 0

    def send(self, data, *args):
        type(self).writes += 1
        return super().send(data, *args)

    def sendall(self, data, *args):
        type(self).writes += 1
        return super().sendall(data, *args)


class _Server:
    supplier = Supplier(tps=1e6, latency_ms=0)


def _request(body: bytes) -> bytes:
    return (b"POST /submit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_each_answer_is_one_write_on_a_no_delay_socket():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, address = listener.accept()
    served = _CountingSocket(accepted.family, accepted.type, fileno=accepted.detach())
    _CountingSocket.writes = 0
    body = json.dumps({"channel": "ch1", "messages": [{"key": "k1", "to": "+861", "text": "x"}]}).encode()
    # Two requests on one kept-alive connection, then the client's end of it.
    client.sendall(_request(body) + _request(body))
    client.shutdown(socket.SHUT_WR)
    handler = threading.Thread(target=_Handler, args=(served, address, _Server()))
    handler.start()
    handler.join(timeout=10)
    assert not handler.is_alive()
    no_delay = served.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    served.close()
    client.settimeout(10)
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    client.close()
    listener.close()
    assert received.count(b"HTTP/1.1 200 OK") == 2
    assert received.count(b'"status": "accepted"') == 2
    assert _CountingSocket.writes == 2  # one write per answer
    assert no_delay
