package e2eutil

import (
	"context"
	"net/http"

	"github.com/ebbdev/ebb/internal/localcluster/appclient"
)

// GetOK sends GET url through client and wants 200 with the whole body
// read: what either kind of node's app answers (the echo's identity, or
// agnhost netexec's time), for loads that only count answers.
func GetOK(ctx context.Context, client *http.Client, url string) error {
	_, err := appclient.GetBody(ctx, client, url)
	return err
}
