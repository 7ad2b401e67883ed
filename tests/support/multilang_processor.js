// A record processor on aws-kcl, the MultiLangDaemon binding for Node.js (its v2 interface):
// appends a line per record and per life-cycle event to the file named by its first argument
// (the format of support/kcl/handled.py), checkpoints at the end of every batch, when asked to
// shut down and at the shard's end.
'use strict';

const fs = require('fs');
const kcl = require('aws-kcl');

const out = fs.openSync(process.argv[2], 'a');
const worker = process.argv[3] || 'node';
let shard = '?';

function now() {
  return (Date.now() / 1000).toFixed(6);
}

function event(name, detail) {
  fs.writeSync(out, `E\t${worker}\t${shard}\t${name}\t${detail || ''}\t${now()}\n`);
}

function checkpoint(checkpointer, sequence, done) {
  const after = function (err) {
    event(err ? 'checkpoint-error' : 'checkpoint', err ? String(err) : String(sequence || 'end'));
    done();
  };
  if (sequence === undefined) {
    checkpointer.checkpoint(after);
  } else {
    checkpointer.checkpoint(sequence, after);
  }
}

const processor = {
  initialize: function (input, done) {
    shard = input.shardId;
    event('initialize', `${input.sequenceNumber}/${input.subSequenceNumber}`);
    done();
  },
  processRecords: function (input, done) {
    const at = now();
    let lines = '';
    for (const record of input.records) {
      const key = Buffer.from(record.data, 'base64').toString().split('|')[0].slice(0, 64);
      lines += `R\t${worker}\t${shard}\t${record.sequenceNumber}\t${record.subSequenceNumber}\t${key}\t${at}\n`;
    }
    fs.writeSync(out, lines);
    if (input.records.length === 0) {
      done();
      return;
    }
    checkpoint(input.checkpointer, input.records[input.records.length - 1].sequenceNumber, done);
  },
  leaseLost: function (input, done) {
    event('lease-lost');
    done();
  },
  shardEnded: function (input, done) {
    event('shard-ended');
    checkpoint(input.checkpointer, undefined, done);
  },
  shutdownRequested: function (input, done) {
    event('shutdown-requested');
    checkpoint(input.checkpointer, undefined, done);
  },
};

kcl(processor).run();
