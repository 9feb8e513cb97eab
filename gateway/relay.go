package gateway

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"proxyfleet/gateway/h1"
)

// relayState is one plain request's relay.
type relayState struct {
	p        Proxy
	at       *attempt
	egress   netip.Addr  // the address of p's it is to leave from (HeaderEgress), if any
	uc       *upConn     // the proxy connection that carries it
	headLen  int         // the answer's head, still in uc.br (0: read already)
	bodySent bool        // the request's body went with its head
	sender   *bodySender // or goes on in a goroutine
	// early: the answer's head came before the sender had sent the
	// whole body; the proxy may read what followed as another request,
	// so its connection is not kept.
	early   bool
	upBytes int64 // body bytes taken from the client
}

// consumeHead drops the request's head from the client's reader.
func (cc *clientConn) consumeHead() {
	if cc.headLen > 0 {
		_, _ = cc.br.Discard(cc.headLen)
		cc.headLen = 0
	}
}

// keepAlive says whether the client's connection may carry another
// request (its own wish, HTTP/1.0's default, the drain).
func (cc *clientConn) keepAlive() bool {
	h := &cc.h
	return !h.Close && (!h.HTTP10 || h.KeepAlive) && !cc.g.draining.Load()
}

// hasBody says whether the request has a body.
func (cc *clientConn) hasBody() bool { return cc.h.Length > 0 || cc.h.Chunked }

func (cc *clientConn) appendConnection(b []byte, keep bool) []byte {
	switch {
	case !keep:
		return append(b, "Connection: close\r\n"...)
	case cc.h.HTTP10:
		return append(b, "Connection: keep-alive\r\n"...)
	}
	return b
}

// requestHead builds the head the proxy gets into cc.out: the request
// line with the absolute target, Host from it, the client's fields but
// the hop-by-hop ones and the gateway's own, the framing, and the
// fleet's credential.
func (cc *clientConn) requestHead(host []byte) []byte {
	h := &cc.h
	b := (*cc.out)[:0]
	b = append(b, h.Line[0]...)
	b = append(b, ' ')
	if t := h.Line[1]; len(t) == len("http://")+len(host) || t[len("http://")+len(host)] == '?' {
		b = append(b, t[:len("http://")+len(host)]...)
		b = append(b, '/')
		b = append(b, t[len("http://")+len(host):]...)
	} else {
		b = append(b, t...)
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	b = appendFields(b, h.Fields)
	switch {
	case h.Chunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case h.Length >= 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, h.Length, 10)
		b = append(b, "\r\n"...)
	}
	if a := cc.g.upstreamAuth; a != "" {
		b = append(b, "Proxy-Authorization: "...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	*cc.out = b[:0]
	return b
}

// withEgress is head req (ending in its empty line) with the HeaderEgress
// field of a, in a slice of its own (req's stays as it is for another
// proxy); req itself for no address.
func withEgress(req []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return req
	}
	line := egressLine(a)
	out := make([]byte, 0, len(req)+len(line))
	out = append(out, req[:len(req)-2]...)
	out = append(out, line...)
	return append(out, "\r\n"...)
}

// appendFields appends the fields that are forwarded as they are.
func appendFields(b []byte, fs []h1.Field) []byte {
	for i := range fs {
		if f := &fs[i]; f.Kind == h1.KindOther {
			b = append(b, f.Name...)
			b = append(b, ": "...)
			b = append(b, f.Value...)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// replayable: a request that may be sent again on a fresh connection to
// the same proxy when a kept-alive one turns out closed (as
// http.Transport: no body, an idempotent method).
func (cc *clientConn) replayable() bool { return !cc.hasBody() && cc.h.Idempotent }

// try sends the request to st.p and reads its answer's head. retryable:
// another proxy may be tried (the client's body was not touched, or is
// held whole). The attempt is a flight (failover.go): the proxy's
// leaving the rotation or its silence ends it early. A replayable request
// whose kept-alive connection the proxy had closed is sent once more on a
// new one.
func (cc *clientConn) try(req []byte, st *relayState) (retryable bool, err error) {
	f := cc.g.begin(st.p, nil)
	defer cc.g.land(f)
	for attempt := 0; ; attempt++ {
		if err := f.err(); err != nil {
			return st.upBytes == 0, err
		}
		uc, now, err := cc.upstream(st, attempt == 0)
		if err != nil {
			return st.upBytes == 0, err
		}
		if err := cc.exchange(uc, req, st, f, now); err != nil {
			err = cc.failed(uc, st, f, err)
			if uc.reused && attempt == 0 && cc.replayable() && staleConn(err) {
				continue
			}
			return st.upBytes == 0, err
		}
		if cc.ruleRetry(uc, st, now) {
			return true, errRuleRetry
		}
		cc.answered(uc, st)
		return true, nil
	}
}

// upstream is a connection to st.p for an attempt, and when it was ready:
// on the first, a pooled one if the pool has one (errSilent when the pool
// found it dead), else a new one.
func (cc *clientConn) upstream(st *relayState, first bool) (*upConn, time.Time, error) {
	g := cc.g
	now := time.Now()
	if first {
		uc, dead := g.pool.get(st.p.Addr, now)
		if dead {
			return nil, now, errSilent
		}
		if uc != nil {
			return uc, now, nil
		}
	}
	c, err := g.dial(g.hard, st.p.Addr)
	if err != nil {
		return nil, now, err
	}
	return newUpConn(c, st.p.Addr), time.Now(), nil
}

// exchange sends req on uc as an attempt of flight f and reads the
// answer's head; the flight watches uc while it does.
func (cc *clientConn) exchange(uc *upConn, req []byte, st *relayState, f *flight, now time.Time) error {
	cc.use(uc)
	uc.client.Store(cc)
	uc.flight = f
	f.carry(uc.c, now)
	err := cc.send(uc, req, st)
	if err == nil {
		err = cc.readAnswerHead(uc, st, now)
	}
	uc.flight = nil
	return err
}

// ruleRetry reports whether a rule asks for the answered request on
// another address; the answer is then dropped with its connection, and a
// body held stays for the next attempt. The answer's body is peeked only
// for a site a body rule names.
func (cc *clientConn) ruleRetry(uc *upConn, st *relayState, now time.Time) bool {
	g := cc.g
	if g.rules.Len() == 0 {
		return false
	}
	var body []byte
	if st.at.sc.needsBody() {
		body = cc.peekBody(uc, st)
	}
	if !g.judge(st.at, cc.rh.Status(), body, time.Since(now), cc.resendable(st)) {
		return false
	}
	uc.c.Close()
	cc.use(nil)
	return true
}

// answered makes uc the attempt's answer: a body held for another
// attempt is dropped from the client's reader, as sent.
func (cc *clientConn) answered(uc *upConn, st *relayState) {
	if cc.held > 0 {
		_, _ = cc.br.Discard(cc.held)
		st.upBytes, st.bodySent = int64(cc.held), true
		cc.held = 0
	}
	st.uc = uc
}

// failed closes uc after a failed attempt, stops the body's sender, and
// is the failure's cause: the client's when it was the client's doing
// (a bad chunked body is told to it), the flight's when its watcher ended
// the attempt, else err.
func (cc *clientConn) failed(uc *upConn, st *relayState, f *flight, err error) error {
	uc.c.Close()
	cc.use(nil)
	if s := st.sender; s != nil {
		st.sender = nil
		s.abort(cc, uc)
		st.upBytes += s.n
		switch {
		case errors.Is(s.clientErr, h1.ErrChunked):
			err = errBodyChunked
		case s.clientErr != nil:
			err = errClientLeft
		}
	}
	if fe := f.err(); fe != nil && !isCanceled(err) {
		err = fe
	}
	return err
}

// staleConn: a failure that a kept-alive connection the proxy had closed
// gives, not the client's leaving, an answer of the proxy or its silence.
func staleConn(err error) bool {
	var ue *upstreamError
	return !isCanceled(err) && !errors.As(err, &ue) && !errors.Is(err, errResponseTimeout)
}

// resendable: the request may go to another address after its answer
// came (a rule's retry): no body, or one held whole (it came with the
// head) of at most RetryBodyBytes.
func (cc *clientConn) resendable(st *relayState) bool {
	return !cc.hasBody() || st.sender == nil && cc.held > 0 && cc.held <= cc.g.cfg.RetryBodyBytes
}

// peekBody is the first BodyPeek bytes of the answer's body, left in
// uc.br for the relay: fewer when the body is shorter, or when it is
// chunked or ends at close (then what came with its first read, chunk
// lines included), or when they do not come within the response
// timeout; nil for an answer without a body.
func (cc *clientConn) peekBody(uc *upConn, st *relayState) []byte {
	rh := &cc.rh
	if s := rh.Status(); cc.h.IsHead || s == http.StatusNoContent || s == http.StatusNotModified || rh.Length == 0 && !rh.Chunked {
		return nil
	}
	n := cc.g.cfg.BodyPeek
	if rh.Length > 0 && !rh.Chunked {
		n = int(min(int64(n), rh.Length))
	}
	if st.headLen+n > uc.br.Size() {
		uc.br = bufio.NewReaderSize(uc.br, st.headLen+n)
	}
	uc.limit.Store(time.Now().Add(cc.g.cfg.ResponseTimeout).UnixNano())
	defer uc.limit.Store(0)
	if rh.Length < 0 || rh.Chunked {
		if _, err := uc.br.Peek(st.headLen + 1); err != nil {
			return nil
		}
		n = min(n, uc.br.Buffered()-st.headLen)
	}
	b, _ := uc.br.Peek(st.headLen + n)
	if len(b) <= st.headLen {
		return nil
	}
	return b[st.headLen:]
}

// send writes the request's head to the proxy, with its body when the
// client sent it all already (one write), or starts the goroutine that
// sends the body.
func (cc *clientConn) send(uc *upConn, req []byte, st *relayState) error {
	g := cc.g
	h := &cc.h
	if !cc.hasBody() {
		cc.consumeHead()
		_, err := uc.c.Write(req)
		return err
	}
	if h.Length > 0 && cc.br.Buffered() >= cc.headLen+int(h.Length) && len(req)+int(h.Length) <= outSize {
		// The body goes in the head's write, and stays in cc.br (held)
		// until the answer comes: another proxy may be sent it.
		all, _ := cc.br.Peek(cc.headLen + int(h.Length))
		b := append(req, all[cc.headLen:]...)
		cc.consumeHead()
		cc.held = int(h.Length)
		_, err := uc.c.Write(b)
		return err
	}
	if _, err := uc.c.Write(req); err != nil {
		return err
	}
	cc.consumeHead()
	if h.Expect100 && !h.HTTP10 && !cc.sentContinue {
		cc.sentContinue = true
		if err := cc.write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
			return errClientLeft
		}
	}
	// The body is read under IdleTimeout (the sender moves the
	// deadline on as bytes come and go).
	cc.idleUntil = time.Time{}
	if err := cc.c.SetReadDeadline(time.Now().Add(g.cfg.IdleTimeout)); err != nil {
		return errClientLeft
	}
	uc.client.Store(nil) // the sender reads the client now
	st.sender = cc.sendBody(uc, g.cfg.ResponseTimeout)
	return nil
}

// readAnswerHead reads the proxy's answer's head into cc.rh (1xx
// interim answers skipped), within the response timeout.
func (cc *clientConn) readAnswerHead(uc *upConn, st *relayState, now time.Time) error {
	if err := uc.arm(now, cc.g.cfg.ResponseTimeout, st.sender != nil); err != nil {
		return err
	}
	for {
		st.headLen = 0
		raw, err := h1.PeekHead(uc.br, false, nil)
		if errors.Is(err, h1.ErrTooLarge) {
			raw, err = h1.ReadLongHead(uc.br, &cc.acc, maxResponseHead)
		} else if err == nil {
			st.headLen = len(raw)
		}
		if errors.Is(err, h1.ErrSyntax) || errors.Is(err, h1.ErrTooLarge) {
			return &upstreamError{causeOther, "malformed answer"}
		}
		if err != nil {
			return err
		}
		if err := cc.rh.Parse(raw, false); err != nil {
			return &upstreamError{causeOther, "malformed answer"}
		}
		markOwn(&cc.rh, nil)
		switch s := cc.rh.Status(); {
		case s == http.StatusSwitchingProtocols:
			return &upstreamError{causeOther, "answered 101 Switching Protocols"}
		case s < 200:
			_, _ = uc.br.Discard(st.headLen) // interim (100 Continue, 103): not passed on
			continue
		case s == http.StatusProxyAuthRequired:
			// The proxy's own answer: our credential is not its.
			return &upstreamError{causeStatus, "answered 407 Proxy Authentication Required"}
		}
		uc.limit.Store(0)
		if s := st.sender; s != nil {
			select {
			case <-s.done:
			default:
				st.early = true
			}
		}
		return nil
	}
}

// isCanceled: the client left, or the drain ran out.
func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
