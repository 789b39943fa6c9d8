"""The simulated supplier answers a kept-alive request in one write, with Nagle off (counted, not timed).

An answer written as two sends (headers, then body) on a Nagle socket holds the
body until the client's delayed ACK of the headers (~40 ms on Linux's loopback):
that tripled the simulated 20 ms request and bounded ``smsload --mode single``.
"""

from __future__ import annotations

import json
import re
import socket
import threading

from tools.sms_supplier import Supplier, SupplierServer


def _request(body: bytes, path: str = "/submit") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _port(server: SupplierServer) -> int:
    return int(server.url.split(":")[2].split("/")[0])


def test_each_answer_is_one_write_on_a_no_delay_socket(monkeypatch):
    writes: list[bool] = []  # one entry per write the server's thread made: TCP_NODELAY on its socket
    real_send = socket.socket.send

    def send(sock, data, *args):
        if threading.current_thread() is not threading.main_thread():  # the server's, not this test's
            writes.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        return real_send(sock, data, *args)

    monkeypatch.setattr(socket.socket, "send", send)
    body = json.dumps({"channel": "ch1", "messages": [{"key": "k1", "to": "+861", "text": "x"}]}).encode()
    with SupplierServer(Supplier(tps=1e6, latency_ms=0)) as server, \
            socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as client:
        # Two requests on one kept-alive connection, sent at once; then the client's end of it.
        client.sendall(_request(body) + _request(body))
        client.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 2
    assert received.count(b'"status": "accepted"') == 2
    assert writes == [True, True]  # one write per answer, each on a no-delay socket


def test_a_bad_request_is_answered_and_the_connection_kept():
    with SupplierServer(Supplier(tps=1e6, latency_ms=0)) as server, \
            socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as client:
        good = json.dumps({"channel": "ch1", "messages": [{"key": "k2", "to": "+862"}]}).encode()
        client.sendall(_request(b'{"channel": "ch1", "messages": [1]}') + _request(b"{}", "/nowhere")
                       + _request(good))
        client.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == [b"400", b"404", b"200"]
    assert server.supplier.stats()["accepted"] == 1


def test_kept_alive_connections_share_one_thread():
    # A thread per connection (http.server's way) cost a wake-up and a GIL hand-off per request on the
    # same two cores as the platform smsload measures: the supplier serves every connection on its loop.
    body = json.dumps({"channel": "ch1", "messages": [{"key": "k3", "to": "+863"}]}).encode()
    with SupplierServer(Supplier(tps=1e6, latency_ms=50)) as server:
        before = threading.active_count()
        clients = [socket.create_connection(("127.0.0.1", _port(server)), timeout=10) for _ in range(8)]
        try:
            for client in clients:
                client.sendall(_request(body))
            during = threading.active_count()  # all eight are in their 50 ms now
            answers = [client.recv(65536) for client in clients]
        finally:
            for client in clients:
                client.close()
    assert all(answer.startswith(b"HTTP/1.1 200 OK") for answer in answers)
    assert during == before
