// Package console is the fleet's web console: a small HTTP server that
// shows the hosts, the proxies, the rotation and the pools, read through
// package client (the reads the CLI makes), live through a server-sent
// events stream fed by the proxies' state events, and lets an admin act
// (recycle a pool, create and delete a proxy) by the ordinary commands on
// NATS.
//
// Nothing of the fleet is served before a login: a user of the config
// logs in with a password (compared in constant time), gets a session
// cookie (HttpOnly, SameSite=Strict, Secure when the request came over
// TLS), and every action is a POST carrying the session's CSRF token;
// users without admin are refused actions (403). Pages are rendered on
// the server with html/template; the assets are embedded, nothing is
// fetched at run time.
package console
