// Preloaded with `node -r loopback.js ...` by shardflow's local stack.
//
// kinesis-local and kinesalite have no host option and listen on every interface. This file
// rewrites every TCP listen() of the process so it binds 127.0.0.1 only, whatever host (or
// none) the emulator asked for. Unix sockets, handles and file descriptors are left alone.
'use strict'

const net = require('net')

const LOOPBACK = '127.0.0.1'
const originalListen = net.Server.prototype.listen

function isPort(value) {
  return typeof value === 'number' || (typeof value === 'string' && /^\d+$/.test(value))
}

function forceLoopback(args) {
  const first = args[0]
  if (isPort(first) || first === undefined || typeof first === 'function') {
    // listen([port[, host[, backlog]]][, callback])
    if (!isPort(first)) return [0, LOOPBACK, ...args]
    if (typeof args[1] === 'string') return [first, LOOPBACK, ...args.slice(2)]
    return [first, LOOPBACK, ...args.slice(1)]
  }
  if (first !== null && typeof first === 'object' && first.path === undefined &&
      first.handle === undefined && first.fd === undefined && !('_handle' in first)) {
    // listen(options[, callback]) with a TCP port
    return [{ ...first, host: LOOPBACK, ipv6Only: false }, ...args.slice(1)]
  }
  return args
}

net.Server.prototype.listen = function listenOnLoopback(...args) {
  return originalListen.apply(this, forceLoopback(args))
}
