//! A TCP proxy between ramd and an S3 server (ramd's `AWS_ENDPOINT_URL`
//! names it) that relays every byte both ways, except that once armed it
//! loses the answer to the next `PUT` of an object whose key ends in
//! `/MANIFEST`: the request reaches the server, which applies it and
//! answers, and the client never sees that answer. It also counts ranged
//! GETs, and can hold those that start past an object's first byte
//! (`hold_ranges`) until `release`: a load is then stopped half way, for
//! as long as the test needs to change the object or stop the server.
//! Plain std::net, one thread per direction of each connection; stopped
//! on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What becomes of the answer the proxy loses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lose {
    /// The client's connection is closed once the server's answer begins
    /// (a reset connection: the client library sends the put again).
    Close,
    /// The answer is swallowed and the connection left open until the
    /// client gives up on it (a timeout: the request fails).
    Hold,
}

#[derive(Default)]
struct Shared {
    /// The next MANIFEST put loses its answer (and disarms).
    armed: Mutex<Option<Lose>>,
    /// Answers lost so far.
    lost: AtomicUsize,
    /// Requests the proxy could not follow (it would relay them wrong).
    faults: Mutex<Vec<String>>,
    /// Ranged GETs relayed or held so far: the path and the first byte.
    ranged: Mutex<Vec<(String, u64)>>,
    /// While true, ranged GETs that start past byte 0 wait (`released`).
    hold: Mutex<bool>,
    released: Condvar,
    /// Requests held so far.
    held: AtomicUsize,
    stop: AtomicBool,
}

pub struct LossyProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl LossyProxy {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> LossyProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("proxy listen");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let server = match TcpStream::connect(("127.0.0.1", upstream)) {
                    Ok(s) => s,
                    Err(_) => continue, // the client sees a closed connection
                };
                relay(client, server, sh.clone());
            }
        });
        LossyProxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next PUT of a MANIFEST loses its answer, as `how` says.
    pub fn arm(&self, how: Lose) {
        *self.shared.armed.lock().unwrap() = Some(how);
    }

    /// From now on, GETs with a range that starts past byte 0 wait before
    /// they are forwarded, until `release`.
    pub fn hold_ranges(&self) {
        *self.shared.hold.lock().unwrap() = true;
    }

    /// Forwards the held requests, and holds no more.
    pub fn release(&self) {
        *self.shared.hold.lock().unwrap() = false;
        self.shared.released.notify_all();
    }

    /// How many requests were held so far.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// The ranged GETs so far whose path ends with `suffix`: the first
    /// byte of each.
    pub fn ranged_gets(&self, suffix: &str) -> Vec<u64> {
        let ranged = self.shared.ranged.lock().unwrap();
        ranged
            .iter()
            .filter(|(p, _)| p.ends_with(suffix))
            .map(|&(_, at)| at)
            .collect()
    }

    /// How many answers were lost so far; fails the test if the proxy met
    /// a request it could not follow.
    pub fn lost(&self) -> usize {
        let faults = self.shared.faults.lock().unwrap();
        assert!(faults.is_empty(), "the proxy relayed wrong: {faults:?}");
        self.shared.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.release();
        // Wakes the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

/// One client connection: requests are read whole (head, then the body
/// its Content-Length gives) so that a MANIFEST put is known before it is
/// forwarded; answers are relayed as bytes. HTTP/1.1 clients send the
/// next request on a connection only after the last answer, so every byte
/// from the server after a request is forwarded belongs to its answer.
fn relay(client: TcpStream, server: TcpStream, sh: Arc<Shared>) {
    let lose: Arc<Mutex<Option<Lose>>> = Arc::new(Mutex::new(None));
    let (c2, s2, sh2, lose2) = (
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
        sh.clone(),
        lose.clone(),
    );
    std::thread::spawn(move || {
        if let Err(e) = requests(&client, &server, &sh, &lose) {
            sh.faults.lock().unwrap().push(e);
        }
        let _ = server.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || answers(c2, s2, &sh2, &lose2));
}

fn requests(
    client: &TcpStream,
    mut server: &TcpStream,
    sh: &Shared,
    lose: &Mutex<Option<Lose>>,
) -> Result<(), String> {
    let mut from = BufReader::new(client);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            match from.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return Ok(()), // the client is gone
                Ok(_) => {}
            }
            let end = line == b"\r\n";
            head.extend_from_slice(&line);
            if end && head.len() > 2 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut words = text.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let path = target.split('?').next().unwrap_or("");
        let mut length = 0u64;
        let mut range_from = None;
        for line in text.lines().skip(1) {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = v
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad length: {line}"))?
                }
                "transfer-encoding" => return Err(format!("a chunked request: {text}")),
                // bytes=FIRST-LAST
                "range" => {
                    range_from = v
                        .trim()
                        .strip_prefix("bytes=")
                        .and_then(|r| r.split('-').next())
                        .and_then(|f| f.parse::<u64>().ok());
                    if range_from.is_none() {
                        return Err(format!("a range it cannot read: {line}"));
                    }
                }
                _ => {}
            }
        }
        if method == "PUT" && path.ends_with("/MANIFEST") {
            if let Some(how) = sh.armed.lock().unwrap().take() {
                *lose.lock().unwrap() = Some(how);
            }
        }
        if let (Some(from), "GET") = (range_from, method) {
            sh.ranged.lock().unwrap().push((path.to_string(), from));
            let mut hold = sh.hold.lock().unwrap();
            if from > 0 && *hold {
                sh.held.fetch_add(1, Ordering::SeqCst);
                while *hold && !sh.stop.load(Ordering::SeqCst) {
                    hold = sh.released.wait(hold).unwrap();
                }
            }
        }
        server
            .write_all(&head)
            .map_err(|e| format!("to the server: {e}"))?;
        let sent = std::io::copy(&mut (&mut from).take(length), &mut server);
        match sent {
            Ok(n) if n == length => {}
            _ => return Ok(()), // either side went away mid-request
        }
    }
}

fn answers(mut client: TcpStream, mut server: TcpStream, sh: &Shared, lose: &Mutex<Option<Lose>>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match *lose.lock().unwrap() {
            None => {
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            // The server has answered, so the put is done; the client
            // never learns it.
            Some(Lose::Close) => {
                sh.lost.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Some(Lose::Hold) => {
                sh.lost.fetch_add(1, Ordering::SeqCst);
                // The rest is swallowed until the client gives up and
                // closes (then `requests` shuts the server side).
                while let Ok(1..) = server.read(&mut buf) {}
                break;
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}
