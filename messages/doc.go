// Package messages is proxyfleet's wire contract (v1): the JSON bodies of
// commands, results, state events, rotation snapshots and dead letters, the
// desired-state record of PROXY_DESIRED, the subjects they travel on, the
// stream and bucket names, strict decoding and validation whose errors name
// the offending field.
//
// It imports neither NATS nor libvirt, so clients in any language can be
// checked against it and so the contract has one home.
package messages
