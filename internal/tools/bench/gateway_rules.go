package main

import (
	"context"
	"fmt"
	"strings"
)

// The gateway-rules section: what judging every answer by gateway.rules
// costs. Two gateway processes on the gateway section's rig (gwRig), one
// without rules and one with benchRules' 20, none of which matches the
// bench's requests; the same clients through each in turn.

// gwRulesN is the number of rules of the ruled gateway.
const gwRulesN = 20

// benchRules is gwRulesN rules in gateway.rules YAML (indented for the
// gateway block), none matching a 200 from the loopback target: status
// rules of other statuses, body rules for other sites (bodies are read
// only for the sites a body rule names), and rules for other sites on
// the status the target answers or on the time to the first byte.
func benchRules() string {
	rules := []string{
		"{status: [403, 429], ban: 30m, retry: true}",
		"{status: [503], retry: true}",
		"{status: [500, 502, 504], ban: 1m}",
		"{status: [401], ban: 5m}",
		"{status: [407], retry: true}",
		"{status: [451], ban: 1h}",
	}
	for i := range 8 {
		rules = append(rules, fmt.Sprintf(`{sites: ["*.shop-%d.example"], body: "(?i)captcha|access denied", ban: 2h, retry: true}`, i))
	}
	for i := range 4 {
		rules = append(rules, fmt.Sprintf(`{sites: ["site-%d.example", "*.site-%d.example"], status: [200], ban: 10m}`, i, i))
	}
	for i := range 2 {
		rules = append(rules, fmt.Sprintf(`{sites: ["slow-%d.example"], first_byte: 20s, ban: 10m}`, i))
	}
	if len(rules) != gwRulesN {
		panic(fmt.Sprintf("benchRules: %d rules, want %d", len(rules), gwRulesN))
	}
	return "  rules:\n    - " + strings.Join(rules, "\n    - ") + "\n"
}

func runGatewayRules(ctx context.Context, b *bench) (sectionResult, error) {
	raiseNofile()
	rig, err := newGWRig(ctx, b, "gateway-rules")
	if err != nil {
		return sectionResult{}, err
	}
	defer rig.close()
	plain, plainAddr, _, err := rig.gateway(ctx, "plain", "")
	if err != nil {
		return sectionResult{}, err
	}
	defer plain.stop(b)
	ruled, ruledAddr, _, err := rig.gateway(ctx, "rules", benchRules())
	if err != nil {
		return sectionResult{}, err
	}
	defer ruled.stop(b)

	var ratios, ratePlain, rateRuled []float64
	for i := range b.runs {
		// Each run measures both; which goes first alternates, so that a
		// machine warming up or slowing down favours neither.
		var p, r float64
		for k := range 2 {
			if (i+k)%2 == 0 {
				if p, _, err = requestRate(ctx, gwVia(plainAddr), rig.target.url); err != nil {
					return sectionResult{}, fmt.Errorf("through the gateway without rules: %w", err)
				}
			} else if r, _, err = requestRate(ctx, gwVia(ruledAddr), rig.target.url); err != nil {
				return sectionResult{}, fmt.Errorf("through the gateway with rules: %w", err)
			}
		}
		ratePlain, rateRuled, ratios = append(ratePlain, p), append(rateRuled, r), append(ratios, r/p)
		b.log.Printf("gateway-rules run %d: %.0f req/s through the gateway with %d rules, %.0f without (ratio %.3f)", i+1, r, gwRulesN, p, r/p)
	}
	f := figure{Key: "gateway_rules_ratio", Section: "gateway-rules", Value: median(ratios), Unit: "ratio", Target: atLeast(0.95), Runs: ratios,
		Ours: fmt.Sprintf("%.0f requests/s through the gateway with %d rules, none matching (median)", median(rateRuled), gwRulesN),
		Peer: fmt.Sprintf("the same gateway without rules: %.0f requests/s", median(ratePlain)),
		How: strings.Replace(gwSetup, "one `proxyfleet gateway` process", "two `proxyfleet gateway` processes", 1) +
			fmt.Sprintf("; one with no rules, one with %d in gateway.rules, none matching the target's 200 (6 on other statuses, 8 body rules for other sites, 4 on status 200 for other sites, 2 on the time to the first byte for other sites: internal/tools/bench/gateway_rules.go); %d clients at once for %s through each, in turn (which goes first alternates by run), per run.", gwRulesN, gwClients, gwRateFor)}
	f.check()
	return sectionResult{figures: []figure{f}}, nil
}
