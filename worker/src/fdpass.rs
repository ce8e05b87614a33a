//! One record, with file descriptors attached, on a SOCK_SEQPACKET socket.
//!
//! SEQPACKET keeps record boundaries, so a frame and the fds sent with it always arrive
//! together; a stream socket would let them drift apart. Both calls are plain syscalls:
//! the zygote uses them blocking, the supervisor inside `AsyncFd::try_io`.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// A pidfd for `pid` (`None` on a kernel without pidfds): the zygote sends one with each
/// fork reply, so the supervisor signals a worker without pid-reuse races; the supervisor
/// opens one on each zygote, which turns readable when it exits. The caller must know
/// `pid` is not reaped yet (its own child, not waited on).
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this fd; we are its only owner.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Most fds one record may carry; more is a protocol violation.
pub const MAX_FDS: usize = 8;

/// Sends `bytes` as one record with `fds` attached.
pub fn send_record(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    let sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent != bytes.len() {
        return Err(io::Error::other(format!(
            "short send: {sent} of {} bytes",
            bytes.len()
        )));
    }
    Ok(())
}

/// A received record. `bytes == 0` with no fds is end of stream.
#[derive(Debug)]
pub struct Record {
    pub bytes: usize,
    pub fds: Vec<OwnedFd>,
}

/// Receives one record into `buf`; attached fds arrive close-on-exec. A record larger than
/// `buf` or carrying more than [`MAX_FDS`] fds is an error (its fds are closed).
pub fn recv_record(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Record> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these fds in this process for us; nothing
                // else owns them, so each becomes an OwnedFd exactly once.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    if msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
    {
        return Err(io::Error::other(
            "record or its fds were larger than the receive buffer",
        ));
    }
    Ok(Record {
        bytes: msg.bytes,
        fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn a_record_carries_its_fds_and_they_work() {
        let (a, b) = seqpacket_pair();
        let (r, w) = nix::unistd::pipe().unwrap();
        send_record(a.as_fd(), b"hello", &[w.as_fd(), r.as_fd()]).unwrap();
        drop((r, w));

        let mut buf = [0u8; 64];
        let rec = recv_record(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..rec.bytes], b"hello");
        assert_eq!(rec.fds.len(), 2);
        let mut fds = rec.fds.into_iter();
        let mut w = std::fs::File::from(fds.next().unwrap());
        let mut r = std::fs::File::from(fds.next().unwrap());
        w.write_all(b"through the passed pipe").unwrap();
        drop(w);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through the passed pipe");
    }

    #[test]
    fn an_oversized_record_is_an_error_not_a_partial_message() {
        let (a, b) = seqpacket_pair();
        send_record(a.as_fd(), &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        assert!(recv_record(b.as_fd(), &mut small).is_err());
    }

    #[test]
    fn closed_peer_reads_as_an_empty_record() {
        let (a, b) = seqpacket_pair();
        drop(a);
        let mut buf = [0u8; 8];
        let rec = recv_record(b.as_fd(), &mut buf).unwrap();
        assert_eq!((rec.bytes, rec.fds.len()), (0, 0));
    }
}
