// An HTTP/2-cleartext front for an HTTP/1.1-only Kinesis emulator (kinesalite).
//
// The KCL's Kinesis client speaks HTTP/2 with prior knowledge, even over plain http://;
// kinesalite speaks HTTP/1.1 only. This server listens on 127.0.0.1 for HTTP/2 cleartext and
// forwards every request to the target as HTTP/1.1 (it does not answer HTTP/1.1 itself).
//
//   node h2c_proxy.js PORT http://127.0.0.1:TARGET_PORT
'use strict'

const http = require('http')
const http2 = require('http2')

const [port, target] = process.argv.slice(2)
const upstream = new URL(target)
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 })
// Connection-specific headers: legal in HTTP/1.1, forbidden in HTTP/2 responses.
const HOP_BY_HOP = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'host',
])

function forward(request, response) {
  const headers = {}
  for (const [name, value] of Object.entries(request.headers)) {
    if (!name.startsWith(':') && !HOP_BY_HOP.has(name)) headers[name] = value
  }
  headers.host = upstream.host
  const outgoing = http.request({
    host: upstream.hostname,
    port: upstream.port,
    method: request.method,
    path: request.url,
    headers,
    agent,
  }, (answer) => {
    const back = {}
    for (const [name, value] of Object.entries(answer.headers)) {
      if (!HOP_BY_HOP.has(name)) back[name] = value
    }
    response.writeHead(answer.statusCode, back)
    answer.pipe(response)
  })
  outgoing.on('error', (error) => {
    if (!response.headersSent) response.writeHead(502, { 'content-type': 'text/plain' })
    response.end(String(error))
  })
  request.pipe(outgoing)
}

const server = http2.createServer({ settings: { maxConcurrentStreams: 1000 } }, forward)
server.on('sessionError', () => {})
server.listen(Number(port), '127.0.0.1')
process.on('SIGTERM', () => process.exit(0))
