package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// AgentPortName is the virtio-serial port name libvirt gives the guest agent channel.
const AgentPortName = "org.qemu.guest_agent.0"

// agentVersion is what guest-info reports.
const agentVersion = "7.2.0-proxyfleet-testguest"

// maxAgentRequest bounds one request object; larger input is discarded.
const maxAgentRequest = 1 << 20

// AgentRequest is one QMP-style command sent by the host.
type AgentRequest struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	ID        json.RawMessage `json:"id,omitempty"`
}

// AgentError is the error member of a reply.
type AgentError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// AgentReply is one reply. Exactly one of Return and Error is set.
type AgentReply struct {
	Return any             `json:"return,omitempty"`
	Error  *AgentError     `json:"error,omitempty"`
	ID     json.RawMessage `json:"id,omitempty"`
	// Delimited asks the writer to put a 0xFF byte before the reply
	// (guest-sync-delimited).
	Delimited bool `json:"-"`
}

// GuestIPAddress is one entry of ip-addresses in guest-network-get-interfaces.
type GuestIPAddress struct {
	Type    string `json:"ip-address-type"`
	Address string `json:"ip-address"`
	Prefix  int    `json:"prefix"`
}

// GuestInterface is one entry of guest-network-get-interfaces.
type GuestInterface struct {
	Name            string           `json:"name"`
	HardwareAddress string           `json:"hardware-address,omitempty"`
	IPAddresses     []GuestIPAddress `json:"ip-addresses,omitempty"`
}

// AgentReader reads requests from the channel: it skips 0xFF bytes and
// whitespace between objects and returns each top-level JSON object, however
// it is split across reads or lines.
type AgentReader struct {
	r *bufio.Reader
}

// NewAgentReader wraps r.
func NewAgentReader(r io.Reader) *AgentReader { return &AgentReader{r: bufio.NewReader(r)} }

// ErrRequestTooLarge is returned when one object exceeds maxAgentRequest; the
// reader has skipped past it.
var ErrRequestTooLarge = errors.New("agent request too large")

// errResync is returned when a 0xFF byte interrupts an object: the partial
// object is dropped without a reply.
var errResync = errors.New("agent input resynchronised")

// errNotObject is returned for input that does not start a JSON object.
var errNotObject = errors.New("agent input is not a JSON object")

// Next returns the raw bytes of the next JSON object.
func (a *AgentReader) Next() ([]byte, error) {
	// Skip delimiters (0xFF, sent by the host to resynchronise) and whitespace.
	var c byte
	for {
		b, err := a.r.ReadByte()
		if err != nil {
			return nil, err
		}
		if b == 0xFF || b == ' ' || b == '\n' || b == '\r' || b == '\t' {
			continue
		}
		c = b
		break
	}
	if c != '{' {
		// Garbage: drop the rest of the line so we resynchronise.
		_, err := a.r.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, err
		}
		return nil, errNotObject
	}
	var buf bytes.Buffer
	buf.WriteByte(c)
	depth, inStr, esc := 1, false, false
	tooLarge := false
	for depth > 0 {
		b, err := a.r.ReadByte()
		if err != nil {
			if err == io.EOF {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if b == 0xFF {
			// The host resynchronises mid-object: drop what we have.
			return nil, errResync
		}
		if !tooLarge {
			buf.WriteByte(b)
			if buf.Len() > maxAgentRequest {
				tooLarge = true
				buf.Reset()
			}
		}
		switch {
		case esc:
			esc = false
		case inStr && b == '\\':
			esc = true
		case b == '"':
			inStr = !inStr
		case inStr:
		case b == '{' || b == '[':
			depth++
		case b == '}' || b == ']':
			depth--
		}
	}
	if tooLarge {
		return nil, ErrRequestTooLarge
	}
	return buf.Bytes(), nil
}

// WriteReply encodes one reply followed by a newline (and preceded by 0xFF
// when it is delimited).
func WriteReply(w io.Writer, rep AgentReply) error {
	var buf bytes.Buffer
	if rep.Delimited {
		buf.WriteByte(0xFF)
	}
	// "return": {} must be present for commands without a value, so encode
	// the members by hand rather than relying on omitempty.
	m := map[string]any{}
	if rep.Error != nil {
		m["error"] = rep.Error
	} else {
		if rep.Return == nil {
			m["return"] = struct{}{}
		} else {
			m["return"] = rep.Return
		}
	}
	if len(rep.ID) > 0 {
		m["id"] = rep.ID
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	buf.Write(b)
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}

// AgentHandler answers requests. Interfaces and Hostname are read on each call.
type AgentHandler struct {
	Interfaces func() ([]GuestInterface, error)
	Hostname   func() string
	Now        func() time.Time
	// Shutdown carries out guest-shutdown ("powerdown", "reboot" or "halt");
	// nil means the command is refused.
	Shutdown func(mode string)
}

// agentCommands lists what guest-info reports as supported.
var agentCommands = []string{
	"guest-sync", "guest-sync-delimited", "guest-ping", "guest-info",
	"guest-network-get-interfaces", "guest-get-host-name", "guest-get-time",
	"guest-shutdown",
}

// Handle answers one raw request. ok is false when no reply must be sent.
func (h *AgentHandler) Handle(raw []byte) (AgentReply, bool) {
	var req AgentRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return AgentReply{Error: &AgentError{Class: "GenericError", Desc: "JSON parse error: " + err.Error()}}, true
	}
	rep := AgentReply{ID: req.ID}
	switch req.Execute {
	case "guest-sync", "guest-sync-delimited":
		var args struct {
			ID json.RawMessage `json:"id"`
		}
		if len(req.Arguments) > 0 {
			if err := json.Unmarshal(req.Arguments, &args); err != nil {
				rep.Error = &AgentError{Class: "GenericError", Desc: "bad arguments: " + err.Error()}
				return rep, true
			}
		}
		if len(args.ID) == 0 {
			rep.Error = &AgentError{Class: "GenericError", Desc: "Parameter 'id' is missing"}
			return rep, true
		}
		rep.Return = args.ID
		rep.Delimited = req.Execute == "guest-sync-delimited"
	case "guest-ping":
		rep.Return = struct{}{}
	case "guest-info":
		type cmd struct {
			Name            string `json:"name"`
			Enabled         bool   `json:"enabled"`
			SuccessResponse bool   `json:"success-response"`
		}
		cmds := make([]cmd, 0, len(agentCommands))
		for _, c := range agentCommands {
			cmds = append(cmds, cmd{Name: c, Enabled: true, SuccessResponse: c != "guest-shutdown"})
		}
		rep.Return = map[string]any{"version": agentVersion, "supported_commands": cmds}
	case "guest-network-get-interfaces":
		if h.Interfaces == nil {
			rep.Return = []GuestInterface{}
			break
		}
		ifs, err := h.Interfaces()
		if err != nil {
			rep.Error = &AgentError{Class: "GenericError", Desc: err.Error()}
			break
		}
		if ifs == nil {
			ifs = []GuestInterface{}
		}
		rep.Return = ifs
	case "guest-get-host-name":
		name := ""
		if h.Hostname != nil {
			name = h.Hostname()
		}
		rep.Return = map[string]string{"host-name": name}
	case "guest-get-time":
		now := time.Now
		if h.Now != nil {
			now = h.Now
		}
		rep.Return = now().UnixNano()
	case "guest-shutdown":
		var args struct {
			Mode string `json:"mode"`
		}
		if len(req.Arguments) > 0 {
			if err := json.Unmarshal(req.Arguments, &args); err != nil {
				rep.Error = &AgentError{Class: "GenericError", Desc: "bad arguments: " + err.Error()}
				return rep, true
			}
		}
		if args.Mode == "" {
			args.Mode = "powerdown"
		}
		if args.Mode != "powerdown" && args.Mode != "reboot" && args.Mode != "halt" {
			rep.Error = &AgentError{Class: "GenericError", Desc: "invalid mode " + args.Mode}
			return rep, true
		}
		if h.Shutdown == nil {
			rep.Error = &AgentError{Class: "GenericError", Desc: "shutdown not supported"}
			return rep, true
		}
		// Like qemu-ga: no reply on success (success-response is false).
		h.Shutdown(args.Mode)
		return rep, false
	case "":
		rep.Error = &AgentError{Class: "GenericError", Desc: "Missing 'execute'"}
	default:
		rep.Error = &AgentError{Class: "CommandNotFound", Desc: fmt.Sprintf("The command %s has not been found", req.Execute)}
	}
	return rep, true
}

// Serve reads requests from rw and writes replies until reading fails.
func (h *AgentHandler) Serve(rw io.ReadWriter) error {
	rd := NewAgentReader(rw)
	for {
		raw, err := rd.Next()
		if err == errResync {
			continue
		}
		if err == errNotObject || err == ErrRequestTooLarge {
			if err2 := WriteReply(rw, AgentReply{Error: &AgentError{Class: "GenericError", Desc: err.Error()}}); err2 != nil {
				return err2
			}
			continue
		}
		if err != nil {
			return err
		}
		rep, ok := h.Handle(raw)
		if !ok {
			continue
		}
		if err := WriteReply(rw, rep); err != nil {
			return err
		}
	}
}

// InterfacesFromNet converts the host view of interfaces into the agent's format.
func InterfacesFromNet(ifs []net.Interface, addrs func(net.Interface) ([]net.Addr, error)) ([]GuestInterface, error) {
	out := make([]GuestInterface, 0, len(ifs))
	for _, ifc := range ifs {
		gi := GuestInterface{Name: ifc.Name}
		if len(ifc.HardwareAddr) > 0 {
			gi.HardwareAddress = ifc.HardwareAddr.String()
		} else {
			gi.HardwareAddress = "00:00:00:00:00:00"
		}
		as, err := addrs(ifc)
		if err != nil {
			return nil, err
		}
		for _, a := range as {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ones, _ := ipn.Mask.Size()
			t := "ipv6"
			if ipn.IP.To4() != nil {
				t = "ipv4"
			}
			gi.IPAddresses = append(gi.IPAddresses, GuestIPAddress{Type: t, Address: ipn.IP.String(), Prefix: ones})
		}
		out = append(out, gi)
	}
	return out, nil
}

// SystemInterfaces reads the guest's interfaces.
func SystemInterfaces() ([]GuestInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	return InterfacesFromNet(ifs, func(i net.Interface) ([]net.Addr, error) { return i.Addrs() })
}

// FindVirtioPort returns the /dev path of the virtio-serial port named name,
// looking under sysRoot (normally /sys/class/virtio-ports) and devRoot (/dev).
func FindVirtioPort(sysRoot, devRoot, name string) (string, error) {
	ents, err := os.ReadDir(sysRoot)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysRoot, e.Name(), "name"))
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			return filepath.Join(devRoot, e.Name()), nil
		}
	}
	return "", fmt.Errorf("no virtio port named %q under %s", name, sysRoot)
}

// Agent runs the handler on the virtio-serial port and can be stopped (the
// port is closed, so the host sees the agent disconnect) and started again.
type Agent struct {
	Handler *AgentHandler
	// Locate returns the port's path; it is retried until it succeeds.
	Locate func() (string, error)
	Log    *log.Logger

	mu      sync.Mutex
	running bool
	f       *os.File
	done    chan struct{}
	gen     int
}

// Running reports whether the agent is started.
func (a *Agent) Running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running
}

// Start opens the port (waiting for it to appear) and serves it in the background.
func (a *Agent) Start() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running {
		return
	}
	a.running = true
	a.gen++
	a.done = make(chan struct{})
	go a.loop(a.gen, a.done)
}

// Stop closes the port; the host sees the agent as disconnected.
func (a *Agent) Stop() {
	a.mu.Lock()
	if !a.running {
		a.mu.Unlock()
		return
	}
	a.running = false
	close(a.done)
	f := a.f
	a.f = nil
	a.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

func (a *Agent) loop(gen int, done chan struct{}) {
	logged := false
	for {
		select {
		case <-done:
			return
		default:
		}
		path, err := a.Locate()
		if err != nil {
			if !logged {
				a.Log.Printf("agent: waiting for port: %v", err)
				logged = true
			}
			sleepOrDone(done, 500*time.Millisecond)
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			a.Log.Printf("agent: open %s: %v", path, err)
			sleepOrDone(done, time.Second)
			continue
		}
		a.mu.Lock()
		if a.gen != gen || !a.running {
			a.mu.Unlock()
			f.Close()
			return
		}
		a.f = f
		a.mu.Unlock()
		a.Log.Printf("agent: serving %s", path)
		// A virtio port reads EOF while the host end is not connected:
		// keep the port open and read again after a short pause.
		for {
			err = a.Handler.Serve(f)
			select {
			case <-done:
				a.Log.Printf("agent: stopped")
				return
			default:
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				sleepOrDone(done, 200*time.Millisecond)
				continue
			}
			a.Log.Printf("agent: %s: %v; reopening", path, err)
			break
		}
		a.mu.Lock()
		if a.f == f {
			a.f = nil
		}
		a.mu.Unlock()
		f.Close()
		sleepOrDone(done, 500*time.Millisecond)
	}
}

func sleepOrDone(done <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
