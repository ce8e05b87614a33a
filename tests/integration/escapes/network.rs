//! Network attacks: a TCP connection to a listener on the host, DNS lookups.

use super::fixture::{EPERM, Fixture, audit, denied, import_denied};

/// Stopped by the import guard and the audit hook.
pub(super) fn python_layer(port: u16) -> Vec<Fixture> {
    vec![
        denied(
            "import socket",
            format!("import socket\nsocket.create_connection(('127.0.0.1', {port}))"),
            import_denied("socket"),
        ),
        denied(
            "TCP connection to a listener on the host",
            format!("import sys\nsys.modules['socket'].socket().connect(('127.0.0.1', {port}))"),
            audit("socket.__new__"),
        ),
        denied(
            "DNS lookup",
            "import sys\nsys.modules['socket'].getaddrinfo('example.com', 443)",
            audit("socket.getaddrinfo"),
        ),
        // asyncio is allowed: its loop wakes itself through a pipe, and what it would
        // reach the network with is refused like any socket.
        denied(
            "asyncio connection to a listener on the host (top-level await)",
            format!("import asyncio\nawait asyncio.open_connection('127.0.0.1', {port})"),
            audit("socket.__new__"),
        ),
        denied(
            "asyncio connection to a listener on the host (asyncio.run)",
            format!("import asyncio\nasyncio.run(asyncio.open_connection('127.0.0.1', {port}))"),
            audit("socket.__new__"),
        ),
        denied(
            "asyncio DNS lookup",
            "import asyncio\nawait asyncio.get_running_loop().getaddrinfo('example.com', 443)",
            audit("socket.getaddrinfo"),
        ),
        denied(
            "the socketpair asyncio's loop would have made",
            "import asyncio\nasyncio.base_events.socket.socketpair()",
            EPERM,
        ),
        denied(
            "an asyncio server on the host",
            "import asyncio\nserver = await asyncio.start_server(lambda r, w: None, '127.0.0.1', 8080)\nprint('listening on', server.sockets)",
            audit("socket.__new__"),
        ),
    ]
}

/// Stopped by seccomp (no new sockets) and the empty network namespace.
pub(super) fn os_layers(port: u16) -> Vec<Fixture> {
    vec![
        denied(
            "TCP connection to the host (seccomp, empty netns)",
            format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
            EPERM,
        ),
        denied(
            "DNS lookup (no sockets, no resolver files)",
            "import socket\nsocket.getaddrinfo('example.com', 443)",
            "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        ),
        denied(
            "asyncio connection to the host (seccomp, empty netns)",
            format!("import asyncio\nawait asyncio.open_connection('127.0.0.1', {port})"),
            EPERM,
        ),
        denied(
            "asyncio's socketpair (seccomp)",
            "import asyncio\nasyncio.base_events.socket.socketpair()",
            EPERM,
        ),
        denied(
            "an asyncio server on the host (seccomp)",
            "import asyncio\nserver = await asyncio.start_server(lambda r, w: None, '127.0.0.1', 8080)\nprint('listening on', server.sockets)",
            EPERM,
        ),
    ]
}
