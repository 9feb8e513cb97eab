package kvm

import (
	"encoding/binary"
	"net"
	"sync"
	"time"
)

// Observer hears what a host entry's links do, for metrics (cmd/proxyfleet
// implements it with Prometheus; this package imports no metrics library).
// Its methods are called from the links' goroutines and must not block.
// Options.Observer nil hears nothing.
type Observer interface {
	// Call is one libvirt remote procedure call (its name, as go-libvirt
	// names the method: "DomainLookupByName", or "other"), from the
	// request's write to the reply's read; failed when the daemon
	// answered an error. A call whose link died first is not heard.
	Call(procedure string, d time.Duration, failed bool)
	// Dial is one dial of a link (the shared one or a transfer's) and its
	// error, nil for a link that opened.
	Dial(err error)
	// Death is a live link dying: killed over a budget, a transport
	// failure, a failed keepalive, a transfer cut. A link closed by
	// Close is not a death.
	Death(reason error)
	// Overrun is a call that ran over its budget (and so killed its link).
	Overrun()
	// ImageBytes is n more bytes of a base image read for an upload.
	ImageBytes(n int64)
}

// nopObserver hears nothing.
type nopObserver struct{}

func (nopObserver) Call(string, time.Duration, bool) {}
func (nopObserver) Dial(error)                       {}
func (nopObserver) Death(error)                      {}
func (nopObserver) Overrun()                         {}
func (nopObserver) ImageBytes(int64)                 {}

// The libvirt RPC wire format (libvirt's src/rpc/virnetprotocol.x): every
// packet starts with its length and a header, all big-endian uint32s.
const (
	rpcHeaderLen     = 28         // len, program, version, procedure, type, serial, status
	rpcRemoteProgram = 0x20008086 // REMOTE_PROGRAM: the procedures below
	rpcTypeCall      = 0
	rpcTypeReply     = 1
	rpcStatusOK      = 0
	rpcMaxPacket     = 32 << 20 // above libvirt's own limit: a length past it means we lost the framing
)

// procNames names the remote procedures this package calls, by number
// (REMOTE_PROC_* of libvirt's remote_protocol.x, as go-libvirt generates
// them; observe_test.go checks them against go-libvirt's table). Any other
// is "other", which keeps the label set bounded.
var procNames = map[uint32]string{
	1: "ConnectOpen", 2: "ConnectClose", 9: "DomainCreate", 11: "DomainDefineXML", 12: "DomainDestroy",
	14: "DomainGetXMLDesc", 23: "DomainLookupByName", 35: "DomainUndefine", 60: "ConnectSupportsFeature",
	66: "AuthList", 76: "StoragePoolCreateXML", 80: "StoragePoolDestroy", 83: "StoragePoolRefresh",
	84: "StoragePoolLookupByName", 93: "StorageVolCreateXML", 94: "StorageVolDelete", 95: "StorageVolLookupByName",
	98: "StorageVolGetInfo", 99: "StorageVolGetXMLDesc", 100: "StorageVolGetPath", 110: "ConnectGetUri",
	157: "ConnectGetLibVersion", 208: "StorageVolUpload", 212: "DomainGetState", 231: "DomainUndefineFlags",
	265: "DomainGetMetadata", 273: "ConnectListAllDomains", 282: "StoragePoolListAllVolumes",
	353: "DomainInterfaceAddresses",
}

func procName(p uint32) string {
	if n, ok := procNames[p]; ok {
		return n
	}
	return "other"
}

// rpcHeader is the part of a packet header the timer reads.
type rpcHeader struct {
	length, program, procedure, typ, serial, status uint32
}

// framer follows the packets of one direction of a connection through
// writes or reads of any size, calling on for each header.
type framer struct {
	hdr  [rpcHeaderLen]byte
	have int    // bytes of hdr filled
	skip uint32 // payload bytes of the current packet still to pass
	lost bool   // the framing is lost: stop looking
	on   func(rpcHeader)
}

func (f *framer) feed(p []byte) {
	for len(p) > 0 && !f.lost {
		if f.skip > 0 {
			n := min(uint32(len(p)), f.skip)
			f.skip -= n
			p = p[n:]
			continue
		}
		n := copy(f.hdr[f.have:], p)
		f.have += n
		p = p[n:]
		if f.have < rpcHeaderLen {
			return
		}
		f.have = 0
		u := func(i int) uint32 { return binary.BigEndian.Uint32(f.hdr[4*i:]) }
		h := rpcHeader{length: u(0), program: u(1), procedure: u(3), typ: u(4), serial: u(5), status: u(6)}
		if h.length < rpcHeaderLen || h.length > rpcMaxPacket {
			f.lost = true
			return
		}
		f.skip = h.length - rpcHeaderLen
		f.on(h)
	}
}

// rpcTimer times the remote procedure calls on a link's transport: it
// reads the packet headers going out and coming back, matches a reply to
// its call by serial, and tells the observer. It only reads the bytes; it
// never changes, delays or fails them.
type rpcTimer struct {
	net.Conn
	obs  Observer
	mu   sync.Mutex
	out  framer // guarded by mu (writes are serialised by go-libvirt, but a kill may race)
	in   framer // the reader goroutine's alone
	sent map[uint32]rpcSent
}

type rpcSent struct {
	proc uint32
	at   time.Time
}

// timeRPCs wraps t so that obs hears every call on it; a nop observer
// leaves t as it is.
func timeRPCs(t net.Conn, obs Observer) net.Conn {
	if _, nop := obs.(nopObserver); nop || obs == nil {
		return t
	}
	r := &rpcTimer{Conn: t, obs: obs, sent: map[uint32]rpcSent{}}
	r.out.on = func(h rpcHeader) {
		if h.program == rpcRemoteProgram && h.typ == rpcTypeCall {
			r.sent[h.serial] = rpcSent{proc: h.procedure, at: time.Now()}
		}
	}
	r.in.on = func(h rpcHeader) {
		if h.program != rpcRemoteProgram || h.typ != rpcTypeReply {
			return
		}
		r.mu.Lock()
		s, ok := r.sent[h.serial]
		delete(r.sent, h.serial)
		r.mu.Unlock()
		if ok {
			r.obs.Call(procName(s.proc), time.Since(s.at), h.status != rpcStatusOK)
		}
	}
	return r
}

func (r *rpcTimer) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.out.feed(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *rpcTimer) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.in.feed(p[:n])
	return n, err
}
