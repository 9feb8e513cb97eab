// Package defaults holds the console's defaults, as constants, so that
// package config fills its YAML from them without importing the console
// (and through it NATS).
package defaults

import "time"

// ViewRefresh is how often, at least, the console's proxies view is read
// afresh (console.view_refresh).
const ViewRefresh = 10 * time.Second

// MinViewRefresh is the shortest console.view_refresh the config takes:
// each read lists the whole fleet.
const MinViewRefresh = time.Second
