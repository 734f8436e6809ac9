// Package eventstest reads what a fake event recorder recorded, for unit
// tests of controllers.
package eventstest

import "k8s.io/client-go/tools/events"

// Recorded returns, and takes out, the events rec holds so far, as
// "Type Reason Message" strings.
func Recorded(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}
