//! Filesystem attacks: reading and writing outside the workspace (host secrets,
//! `/etc/shadow`, `/proc/self/mem`, the Python prefix, shared config), symlinks out of the
//! workspace, other workers' workspaces.

use super::fixture::{Fixture, denied, eacces, prints, write_denied};

/// Stopped by the audit hook's `open` policy, backed by Landlock and the uid drop.
pub(super) fn python_layer(secret: &str) -> Vec<Fixture> {
    vec![
        denied(
            "reading /etc/shadow",
            "print(open('/etc/shadow').read())",
            eacces("/etc/shadow"),
        ),
        denied(
            "reading a host secret outside the workspace",
            format!("print(open('{secret}').read())"),
            eacces(secret),
        ),
        denied(
            "writing the host secret",
            format!("open('{secret}', 'w').write('pwned')"),
            write_denied(secret),
        ),
        denied(
            "os.open for writing outside the workspace",
            "import os\nos.open('/tmp/snakecage-escape', os.O_WRONLY | os.O_CREAT)",
            write_denied("/tmp/snakecage-escape"),
        ),
        denied(
            "symlink in the workspace pointing out",
            "import os\nos.symlink('/etc/passwd', 'link')\nopen('link', 'a').write('x')",
            eacces("link"),
        ),
        denied(
            "listing the other workspaces",
            "import os\nprint(os.listdir('..'))",
            eacces(".."),
        ),
        denied(
            "/proc/self/mem write",
            "open('/proc/self/mem', 'wb')",
            write_denied("/proc/self/mem"),
        ),
        // On a tier that preloads numpy: its zygote's descriptors are gone as well.
        prints(
            "a descriptor of the zygote's (numpy's tier)",
            format!("import numpy\n{OPEN_FDS}"),
            "True []\n",
        ),
    ]
}

/// Prints which of the job's descriptors name one of the Landlock rules' paths (the Python
/// prefix, site-packages, the system libraries, the device nodes). The zygote opens those
/// paths once (`O_PATH`) and its workers inherit the descriptors; a worker closes them
/// before any job runs, so a job holds none (stdin, `/dev/null` from the supervisor, is
/// not counted). Other open files a tier's warm-up left (matplotlib keeps its fonts open)
/// are not the zygote's and are not listed. `True`: the paths were found to compare with.
const OPEN_FDS: &str = "import os, sys\nids = set()\nfor p in [sys.base_prefix, '/usr/lib', '/etc/ld.so.cache', '/dev/null', '/dev/urandom', *(p for p in sys.path if p.endswith('site-packages'))]:\n    try:\n        st = os.stat(p)\n        ids.add((st.st_dev, st.st_ino))\n    except OSError:\n        pass\ndef held(fd):\n    try:\n        st = os.fstat(fd)\n    except OSError:\n        return False\n    return (st.st_dev, st.st_ino) in ids\nprint(len(ids) >= 5, [fd for fd in range(1, 1024) if held(fd)])";

/// Stopped by Landlock, the uid drop and the zygote's mount namespace.
pub(super) fn os_layers(secret: &str) -> Vec<Fixture> {
    vec![
        denied(
            "reading /etc/shadow (Landlock)",
            "open('/etc/shadow').read()",
            eacces("/etc/shadow"),
        ),
        denied(
            "reading a host secret (Landlock)",
            format!("open('{secret}').read()"),
            eacces(secret),
        ),
        denied(
            "writing outside the workspace (Landlock)",
            "open('/tmp/snakecage-escape', 'w')",
            eacces("/tmp/snakecage-escape"),
        ),
        // matplotlib's shared config dir passes `access(W_OK)` (mode 1777) for workers of
        // tiers that import matplotlib late; Landlock still keeps it read-only.
        prints(
            "writing into matplotlib's shared config dir (Landlock)",
            "import os\nd = os.environ['MPLCONFIGDIR']\nprint(os.access(d, os.W_OK))\nfor f in ('matplotlibrc', 'fontlist-v999.json'):\n    try:\n        open(os.path.join(d, f), 'w')\n    except OSError as e:\n        print(e.errno, e.strerror)",
            "True\n13 Permission denied\n13 Permission denied\n",
        ),
        denied(
            "/proc/self/mem write (Landlock)",
            "open('/proc/self/mem', 'wb')",
            eacces("/proc/self/mem"),
        ),
        prints(
            "a descriptor of the zygote's (Landlock's rule paths)",
            OPEN_FDS,
            "True []\n",
        ),
        prints(
            "writing into the Python prefix",
            "import sys\ntry:\n    open(sys.base_prefix + '/lib/python3.12/os.py', 'a')\nexcept OSError as e:\n    print(e.errno, e.strerror)",
            "13 Permission denied\n",
        ),
        denied(
            "listing /root (tmpfs in the zygote's mount namespace, Landlock)",
            "import os\nprint(os.listdir('/root'))",
            eacces("/root"),
        ),
    ]
}

/// Reading the `secret.txt` planted in every other worker's workspace
/// ([`super::host::plant_secrets_in_workspaces`]).
pub(super) fn other_workspaces() -> Fixture {
    let probe = "import os\nroot, mine = os.path.split(os.getcwd())\nseen = set()\nfor n in range(1, 500):\n    if f'w{n}' == mine:\n        continue\n    try:\n        open(os.path.join(root, f'w{n}', 'secret.txt')).read()\n        seen.add('READ')\n    except PermissionError:\n        seen.add('denied')\n    except FileNotFoundError:\n        pass\nprint(sorted(seen))";
    prints("reading another worker's workspace", probe, "['denied']\n")
}
