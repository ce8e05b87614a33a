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
    ]
}
